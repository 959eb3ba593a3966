//! When a parent's `Ready` counts (issue 36, the evidence rule): its API pod says Ready,
//! the containers that status names are the ones the runtime runs now, and, unless its
//! content is known to work, the condition has held for [`READY_SETTLE`].
//!
//! The API's word alone is not enough, for two reasons a real node showed:
//! - **Stale after a reboot.** The API keeps a pod's last status until the kubelet writes a
//!   new one: right after a power cut a parent reads Ready while its containers are
//!   starting again, and a `when-ready` checkpoint retired then takes the node's only API
//!   server with it. The status names containers the runtime no longer runs.
//! - **A probe answered by the checkpoint.** A host-network parent that binds beside its
//!   checkpoint (`when-ready`) is probed on the port the checkpoint serves: a crash-looping
//!   kube-apiserver reads Ready for the second or two each of its containers lives. The
//!   flash never lasts [`READY_SETTLE`].
//!
//! Content known to work counts at once once current: the pod's own known-good mark, or
//! its own checkpoint active with that very content (after a power cut: what the
//! checkpoint serves, the parent runs). Every second two kube-apiservers share a port
//! costs: each one's loopback client reaches the other half the time, whose certificate
//! it does not trust; a real node's parent failed its start-up hooks that way and exited a
//! minute later. A new revision (a bad upgrade's pod beside the known-good checkpoint), a
//! rollback's pod, a suspended mark or unknown marks wait for the settle.
//!
//! Without a current look at the runtime (unknown, or the parent not running) nothing is
//! Ready: every use of readiness (retiring a checkpoint, ending a handoff, proving content)
//! keeps the last safe state on no evidence.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use crate::time::Timestamp;

/// How long a parent's `Ready` condition must have held, by its `lastTransitionTime`,
/// before it counts: past the Ready flash of a crash-looping container whose probe the
/// checkpoint answered (about two seconds on the real node: one probe period).
pub const READY_SETTLE: Duration = Duration::from_secs(10);

/// What a parent's readiness is worth in this pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Readiness {
    /// Ready, on evidence.
    Ready,
    /// Ready by a current status that has not held for [`READY_SETTLE`] yet: it counts from
    /// then (look again then).
    SettlesAt(Timestamp),
    /// Not Ready, or no evidence that it is.
    NotReady,
}

/// Whether an API pod is running and Ready (its `Ready` condition is `True`), by its
/// status alone.
pub(crate) fn is_ready(pod: &Pod) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    status.phase.as_deref() == Some("Running")
        && (status.conditions.iter().flatten()).any(|c| c.type_ == "Ready" && c.status == "True")
}

/// A parent's readiness on evidence. `running` holds the ids of the containers the runtime
/// runs for it now (`None`: the runtime is unknown or runs none of them); `known_to_work`:
/// its current content is known to work (no settle).
pub(crate) fn readiness(
    pod: &Pod,
    running: Option<&BTreeSet<String>>,
    known_to_work: bool,
    now: Timestamp,
) -> Readiness {
    let (Some(status), Some(running)) = (pod.status.as_ref(), running) else {
        return Readiness::NotReady;
    };
    if !is_ready(pod) {
        return Readiness::NotReady;
    }
    // Every container the status names runs, as that very container.
    let statuses = status.container_statuses.as_deref().unwrap_or_default();
    let current = !statuses.is_empty()
        && statuses.iter().all(|s| {
            let runs = s.state.as_ref().is_some_and(|st| st.running.is_some());
            runs && (s.container_id.as_deref()).is_some_and(|id| running.contains(runtime_id(id)))
        });
    if !current {
        return Readiness::NotReady;
    }
    if known_to_work {
        return Readiness::Ready;
    }
    let since = (status.conditions.iter().flatten())
        .find(|c| c.type_ == "Ready")
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| Timestamp(t.0.as_millisecond()));
    // Without a transition time nothing says since when: it counts from now. A time ahead
    // of the agent's clock counts from now too.
    let since = since.map_or(now, |s| s.min(now));
    let settled = since.saturating_add(READY_SETTLE);
    if now >= settled {
        Readiness::Ready
    } else {
        Readiness::SettlesAt(settled)
    }
}

/// A container's id as the runtime names it: the API's `containerID` without its
/// `<runtime>://` prefix.
pub fn runtime_id(container_id: &str) -> &str {
    container_id.split_once("://").map_or(container_id, |(_, id)| id)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pod Running, with its Ready condition and one container status.
    fn pod(ready: &str, transition: Option<&str>, container: serde_json::Value) -> Pod {
        let mut condition = serde_json::json!({ "type": "Ready", "status": ready });
        if let Some(t) = transition {
            condition["lastTransitionTime"] = t.into();
        }
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "p" },
            "status": {
                "phase": "Running",
                "conditions": [{ "type": "PodScheduled", "status": "True" }, condition],
                "containerStatuses": [container],
            }
        }))
        .expect("a pod")
    }

    fn container(id: Option<&str>, running: bool) -> serde_json::Value {
        let state = if running {
            serde_json::json!({ "running": { "startedAt": "2026-01-01T00:00:00Z" } })
        } else {
            serde_json::json!({ "terminated": { "exitCode": 1 } })
        };
        let mut c = serde_json::json!({
            "name": "c", "ready": true, "restartCount": 0, "image": "", "imageID": "", "state": state,
        });
        if let Some(id) = id {
            c["containerID"] = id.into();
        }
        c
    }

    /// When every case looks.
    const NOW: &str = "2026-01-01T00:01:00Z";

    fn at(time: &str) -> Timestamp {
        Timestamp::parse_rfc3339(time).expect("a time")
    }

    fn check(pod: &Pod, running: Option<&[&str]>, known_to_work: bool, expected: Readiness) {
        let running: Option<BTreeSet<String>> = running.map(|r| r.iter().map(|s| (*s).to_owned()).collect());
        assert_eq!(readiness(pod, running.as_ref(), known_to_work, at(NOW)), expected);
    }

    #[test]
    fn readiness_needs_current_containers_and_a_settled_condition() {
        let long_ago = Some("2026-01-01T00:00:00Z");
        let just_now = Some("2026-01-01T00:00:59Z");
        let c1 = container(Some("containerd://c1"), true);
        /// (what, the pod, the containers the runtime runs, its content known to work,
        /// expected)
        type Case<'a> = (&'a str, Pod, Option<&'a [&'a str]>, bool, Readiness);
        let cases: Vec<Case<'_>> = vec![
            (
                "Ready for a minute, its container runs",
                pod("True", long_ago, c1.clone()),
                Some(&["c1"]),
                false,
                Readiness::Ready,
            ),
            (
                "a stale status after a reboot: the runtime runs another container",
                pod("True", long_ago, c1.clone()),
                Some(&["c2"]),
                false,
                Readiness::NotReady,
            ),
            (
                "the runtime unknown",
                pod("True", long_ago, c1.clone()),
                None,
                false,
                Readiness::NotReady,
            ),
            (
                "a Ready flash: counts only once it has held",
                pod("True", Some("2026-01-01T00:00:58Z"), c1.clone()),
                Some(&["c1"]),
                false,
                Readiness::SettlesAt(at("2026-01-01T00:01:08Z")),
            ),
            (
                "no transition time: counts from now",
                pod("True", None, c1.clone()),
                Some(&["c1"]),
                false,
                Readiness::SettlesAt(at("2026-01-01T00:01:10Z")),
            ),
            (
                "a transition ahead of the clock: counts from now",
                pod("True", Some("2026-01-01T01:00:00Z"), c1.clone()),
                Some(&["c1"]),
                false,
                Readiness::SettlesAt(at("2026-01-01T00:01:10Z")),
            ),
            (
                "not Ready",
                pod("False", long_ago, c1.clone()),
                Some(&["c1"]),
                false,
                Readiness::NotReady,
            ),
            (
                "the status names no container id",
                pod("True", long_ago, container(None, true)),
                Some(&["c1"]),
                false,
                Readiness::NotReady,
            ),
            (
                "the container the status names has exited",
                pod("True", long_ago, container(Some("containerd://c1"), false)),
                Some(&["c1"]),
                false,
                Readiness::NotReady,
            ),
            (
                "content known to work: counts once current, without the settle",
                pod("True", just_now, c1.clone()),
                Some(&["c1"]),
                true,
                Readiness::Ready,
            ),
            (
                "content known to work, but a status kept from before a reboot",
                pod("True", just_now, c1.clone()),
                Some(&["c2"]),
                true,
                Readiness::NotReady,
            ),
            (
                "content known to work, the runtime unknown",
                pod("True", just_now, c1.clone()),
                None,
                true,
                Readiness::NotReady,
            ),
        ];
        for (what, pod, running, known_to_work, expected) in cases {
            eprintln!("case: {what}");
            check(&pod, running, known_to_work, expected);
        }
    }

    #[test]
    fn no_container_statuses_is_no_evidence() {
        let mut p = pod("True", Some("2026-01-01T00:00:00Z"), container(Some("c1"), true));
        if let Some(s) = p.status.as_mut() {
            s.container_statuses = None;
        }
        check(&p, Some(&["c1"]), false, Readiness::NotReady);
    }

    #[test]
    fn ready_means_running_with_the_ready_condition_true() {
        let pod = |phase: &str, ready: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": "p" },
                "status": { "phase": phase, "conditions": [
                    { "type": "PodScheduled", "status": "True" },
                    { "type": "Ready", "status": ready }
                ] }
            }))
            .expect("a pod")
        };
        assert!(is_ready(&pod("Running", "True")));
        assert!(!is_ready(&pod("Running", "False")));
        assert!(!is_ready(&pod("Pending", "True")));
        assert!(!is_ready(&Pod::default()));
    }

    #[test]
    fn runtime_ids_lose_their_scheme() {
        assert_eq!(runtime_id("containerd://abc"), "abc");
        assert_eq!(runtime_id("abc"), "abc");
    }
}
