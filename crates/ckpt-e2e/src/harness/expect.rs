//! The expectations the end-to-end suite and the demo share, each a bounded poll of one
//! source: the agent's disk (`pod-checkpointer inspect`), the kubelet's runtime (CRI) or the
//! API server (kubectl). Each returns how long it waited, for narration.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use super::agent::{self, AgentDirs, CheckpointInfo};
use super::kubectl::{self, Kubectl};
use crate::e2e_env::cri::CriClient;
use crate::wait::{DEFAULT_TIMEOUT, Probe, wait_for, waiting_on_error};

/// Where expectations look: the API as admin, the hollow kubelet's runtime, and the agent
/// binary for `inspect`.
#[derive(Clone, Copy)]
pub struct Expect<'a> {
    pub kubectl: &'a Kubectl,
    pub cri: &'a CriClient,
    pub agent_bin: &'a Path,
}

impl Expect<'_> {
    /// Waits until `inspect` on `dirs` shows a checkpoint of `namespace/name` for which
    /// `check` holds (`expected` describes it).
    pub fn checkpoint(
        &self,
        dirs: &AgentDirs,
        namespace: &str,
        name: &str,
        expected: &str,
        check: impl Fn(&CheckpointInfo) -> bool,
    ) -> anyhow::Result<(CheckpointInfo, Duration)> {
        let pod = format!("{namespace}/{name}");
        wait_for(
            &format!("the checkpoint of {pod} with {expected}"),
            DEFAULT_TIMEOUT,
            || {
                let inspect = agent::inspect(self.agent_bin, dirs)?;
                Ok(match inspect.get(&pod) {
                    Some(c) if check(c) => Probe::Ready(c.clone()),
                    _ => Probe::Waiting(inspect.summary()),
                })
            },
        )
    }

    /// Waits until `inspect` shows no checkpoint of `namespace/name`.
    pub fn no_checkpoint(&self, dirs: &AgentDirs, namespace: &str, name: &str) -> anyhow::Result<Duration> {
        let pod = format!("{namespace}/{name}");
        wait_for(
            &format!("the checkpoint of {pod} to be removed"),
            DEFAULT_TIMEOUT,
            || {
                let inspect = agent::inspect(self.agent_bin, dirs)?;
                Ok(match inspect.get(&pod) {
                    None => Probe::Ready(()),
                    Some(_) => Probe::Waiting(inspect.summary()),
                })
            },
        )
        .map(|((), took)| took)
    }

    /// Waits until the runtime has a ready sandbox for `namespace/name` (for a static pod:
    /// `<manifest name>-<node>`).
    pub fn kubelet_runs(&self, namespace: &str, name: &str, timeout: Duration) -> anyhow::Result<Duration> {
        self.kubelet_state(namespace, name, true, timeout)
    }

    /// Waits until the runtime has no ready sandbox for `namespace/name`.
    pub fn kubelet_stopped(&self, namespace: &str, name: &str) -> anyhow::Result<Duration> {
        self.kubelet_state(namespace, name, false, DEFAULT_TIMEOUT)
    }

    fn kubelet_state(
        &self,
        namespace: &str,
        name: &str,
        running: bool,
        timeout: Duration,
    ) -> anyhow::Result<Duration> {
        let pod = format!("{namespace}/{name}");
        let expected = if running {
            format!("the kubelet to run {pod}")
        } else {
            format!("the kubelet to stop {pod}")
        };
        wait_for(&expected, timeout, || {
            waiting_on_error(self.cri.running_pods().map(|all| {
                if all.contains(&pod) == running {
                    Probe::Ready(())
                } else {
                    Probe::Waiting(format!("running: {}", running_in(&all, namespace)))
                }
            }))
        })
        .map(|((), took)| took)
    }

    /// Waits until the API has pod `namespace/name` and `check` holds for it.
    pub fn api_pod(
        &self,
        namespace: &str,
        name: &str,
        expected: &str,
        timeout: Duration,
        check: impl Fn(&Value) -> bool,
    ) -> anyhow::Result<(Value, Duration)> {
        wait_for(
            &format!("pod {namespace}/{name} {expected} in the API"),
            timeout,
            || {
                waiting_on_error(self.kubectl.get("pod", namespace, name).map(|found| match found {
                    Some(p) if check(&p) => Probe::Ready(p),
                    Some(p) => Probe::Waiting(format!("phase {:?}", kubectl::pod_phase(&p))),
                    None => Probe::Waiting("no such pod".into()),
                }))
            },
        )
    }

    /// Waits until pod `namespace/name` is Running with every container running.
    pub fn api_pod_running(&self, namespace: &str, name: &str) -> anyhow::Result<Duration> {
        self.api_pod(namespace, name, "Running", DEFAULT_TIMEOUT, kubectl::pod_running)
            .map(|(_, took)| took)
    }

    /// Waits until pod `namespace/name` is gone from the API.
    pub fn api_pod_gone(&self, namespace: &str, name: &str) -> anyhow::Result<Duration> {
        wait_for(
            &format!("pod {namespace}/{name} gone from the API"),
            DEFAULT_TIMEOUT,
            || {
                waiting_on_error(self.kubectl.get("pod", namespace, name).map(|found| match found {
                    None => Probe::Ready(()),
                    Some(p) => Probe::Waiting(format!("still there, phase {:?}", kubectl::pod_phase(&p))),
                }))
            },
        )
        .map(|((), took)| took)
    }
}

/// The running pods of `namespace`, for "last seen" messages.
fn running_in(running: &BTreeSet<String>, namespace: &str) -> String {
    let prefix = format!("{namespace}/");
    let here: Vec<&str> = running
        .iter()
        .filter(|p| p.starts_with(&prefix))
        .map(String::as_str)
        .collect();
    if here.is_empty() {
        format!("nothing in namespace {namespace}")
    } else {
        here.join(", ")
    }
}
