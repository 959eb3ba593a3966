//! A small synchronous client for the hollow kubelet's fake container runtime (a CRI
//! `RuntimeService` on a unix socket): which pod sandboxes and containers exist, and
//! stopping a pod the way a crash would (StopContainer, then StopPodSandbox; with
//! `restartPolicy: Never` the kubelet then leaves it dead).
//!
//! A blocking facade over `ckpt-cri`'s client, the agent's own CRI wire: the messages are
//! checked against the upstream `api.proto` there, so sharing them does not let a wrong
//! field pass unnoticed. Each call runs on a current-thread runtime of its own with its own
//! connection (the API version negotiated on it), so a clone can poll from another thread
//! and a restarted runtime is never seen through a stale connection.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
pub use ckpt_cri::Stopped;
use ckpt_cri::{RuntimeClient, proto};

/// A CRI runtime reached over a unix socket; every call opens its own connection.
#[derive(Clone, Debug)]
pub struct CriClient {
    socket: PathBuf,
    timeout: Duration,
}

/// A pod sandbox as the runtime lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sandbox {
    pub id: String,
    pub namespace: String,
    /// The pod's name; a static pod's is `<manifest name>-<node>`.
    pub name: String,
    /// `SANDBOX_READY` (as opposed to `SANDBOX_NOTREADY`, i.e. stopped).
    pub ready: bool,
}

/// A container as the runtime lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Container {
    pub id: String,
    pub sandbox_id: String,
    pub name: String,
    pub state: ContainerState,
    pub labels: BTreeMap<String, String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerState {
    Created,
    Running,
    Exited,
    Unknown,
}

impl From<proto::PodSandbox> for Sandbox {
    fn from(s: proto::PodSandbox) -> Sandbox {
        let metadata = s.metadata.unwrap_or_default();
        Sandbox {
            id: s.id,
            namespace: metadata.namespace,
            name: metadata.name,
            ready: s.state == proto::SANDBOX_READY,
        }
    }
}

impl From<proto::Container> for Container {
    fn from(c: proto::Container) -> Container {
        Container {
            id: c.id,
            sandbox_id: c.pod_sandbox_id,
            name: c.metadata.map(|m| m.name).unwrap_or_default(),
            state: match c.state {
                proto::CONTAINER_CREATED => ContainerState::Created,
                proto::CONTAINER_RUNNING => ContainerState::Running,
                proto::CONTAINER_EXITED => ContainerState::Exited,
                _ => ContainerState::Unknown,
            },
            labels: c.labels,
        }
    }
}

impl CriClient {
    /// A client for `socket` (a path, or `unix:///path`); nothing is dialled yet.
    pub fn new(socket: &str) -> CriClient {
        let path = socket.strip_prefix("unix://").unwrap_or(socket);
        CriClient {
            socket: PathBuf::from(path),
            timeout: Duration::from_secs(5),
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Every pod sandbox, ready or stopped.
    pub fn sandboxes(&self) -> anyhow::Result<Vec<Sandbox>> {
        let sandboxes = self.run(async |cri| cri.list_pod_sandbox(None).await)?;
        Ok(sandboxes.into_iter().map(Sandbox::from).collect())
    }

    /// Every container, in any state.
    pub fn containers(&self) -> anyhow::Result<Vec<Container>> {
        let containers = self.run(async |cri| cri.list_containers(None).await)?;
        Ok(containers.into_iter().map(Container::from).collect())
    }

    /// The pods (`namespace/name`) that have a ready sandbox: what the kubelet runs.
    pub fn running_pods(&self) -> anyhow::Result<BTreeSet<String>> {
        Ok(self
            .sandboxes()?
            .into_iter()
            .filter(|s| s.ready)
            .map(|s| format!("{}/{}", s.namespace, s.name))
            .collect())
    }

    /// Whether the pod has a ready sandbox.
    pub fn is_running(&self, namespace: &str, name: &str) -> anyhow::Result<bool> {
        Ok(self
            .sandboxes()?
            .iter()
            .any(|s| s.ready && s.namespace == namespace && s.name == name))
    }

    /// Stops a pod like a crash: `StopContainer` (no grace) for each of its containers that
    /// has not exited, then `StopPodSandbox` for each of its ready sandboxes. Fails when the
    /// runtime runs nothing of that pod.
    pub fn stop_pod(&self, namespace: &str, name: &str) -> anyhow::Result<Stopped> {
        self.run(async |cri| cri.stop_pod(namespace, name).await)
    }

    /// Runs `call` against a fresh client on a runtime of its own.
    fn run<T>(&self, call: impl AsyncFnOnce(&RuntimeClient) -> ckpt_cri::Result<T>) -> anyhow::Result<T> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start a Tokio runtime for the CRI client")?;
        let endpoint = self.socket.to_string_lossy();
        let outcome = runtime.block_on(async {
            let cri = RuntimeClient::new(&endpoint, self.timeout)?;
            call(&cri).await
        });
        Ok(outcome?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(sandbox: proto::PodSandbox, container: proto::Container, expected: (Sandbox, Container)) {
        assert_eq!((Sandbox::from(sandbox), Container::from(container)), expected);
    }

    #[test]
    fn listed_messages_become_the_harness_view() {
        let sandbox = |state| proto::PodSandbox {
            id: "sb1".into(),
            metadata: Some(proto::PodSandboxMetadata {
                name: "kube-apiserver-node-1".into(),
                uid: "uid".into(),
                namespace: "kube-system".into(),
                attempt: 0,
            }),
            state,
            ..Default::default()
        };
        let container = |state| proto::Container {
            id: "c1".into(),
            pod_sandbox_id: "sb1".into(),
            metadata: Some(proto::ContainerMetadata {
                name: "apiserver".into(),
                attempt: 0,
            }),
            state,
            labels: [(
                proto::LABEL_POD_NAME.to_owned(),
                "kube-apiserver-node-1".to_owned(),
            )]
            .into(),
            ..Default::default()
        };
        let expected = |ready, state| {
            (
                Sandbox {
                    id: "sb1".into(),
                    namespace: "kube-system".into(),
                    name: "kube-apiserver-node-1".into(),
                    ready,
                },
                Container {
                    id: "c1".into(),
                    sandbox_id: "sb1".into(),
                    name: "apiserver".into(),
                    state,
                    labels: [(
                        proto::LABEL_POD_NAME.to_owned(),
                        "kube-apiserver-node-1".to_owned(),
                    )]
                    .into(),
                },
            )
        };
        let cases = [
            (
                proto::SANDBOX_READY,
                proto::CONTAINER_CREATED,
                true,
                ContainerState::Created,
            ),
            (
                proto::SANDBOX_READY,
                proto::CONTAINER_RUNNING,
                true,
                ContainerState::Running,
            ),
            (
                proto::SANDBOX_NOTREADY,
                proto::CONTAINER_EXITED,
                false,
                ContainerState::Exited,
            ),
            (
                proto::SANDBOX_NOTREADY,
                proto::CONTAINER_UNKNOWN,
                false,
                ContainerState::Unknown,
            ),
            (proto::SANDBOX_NOTREADY, 7, false, ContainerState::Unknown),
        ];
        for (sandbox_state, container_state, ready, state) in cases {
            check(
                sandbox(sandbox_state),
                container(container_state),
                expected(ready, state),
            );
        }
    }

    #[test]
    fn a_missing_socket_is_an_error_naming_it() {
        let dir = std::env::temp_dir().join("xtask-cri-test-no-such-dir");
        let socket = dir.join("cri.sock");
        let cri = CriClient::new(&format!("unix://{}", socket.display()));
        assert_eq!(cri.socket(), socket);
        let err = cri.sandboxes().unwrap_err();
        assert!(
            format!("{err:#}").contains(&socket.display().to_string()),
            "{err:#}"
        );
    }
}
