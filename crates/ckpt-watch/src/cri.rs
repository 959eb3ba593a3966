//! Which pods run, as the CRI runtime says: [`ckpt_cri::RuntimeClient`] answers turned
//! into pod ids.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use ckpt_core::PodId;

use crate::error::Result;

pub use ckpt_cri::ApiVersion as CriApi;
pub use ckpt_cri::proto;
pub use ckpt_cri::proto::{LABEL_POD_NAME, LABEL_POD_NAMESPACE};

/// A CRI `RuntimeService` client over a unix socket, asking which pods run.
///
/// The API version is negotiated on first use (`runtime.v1`, else `runtime.v1alpha2`)
/// and renegotiated after a broken connection; every call is bounded by the timeout
/// (see [`ckpt_cri::RuntimeClient`]).
#[derive(Debug)]
pub struct CriClient {
    runtime: ckpt_cri::RuntimeClient,
}

impl CriClient {
    /// A client for `unix:///path/to/socket` (or a plain absolute `/path`). Nothing is
    /// dialled until the first call.
    pub fn new(endpoint: &str, timeout: Duration) -> Result<Self> {
        Ok(Self {
            runtime: ckpt_cri::RuntimeClient::new(endpoint, timeout)?,
        })
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        self.runtime.socket()
    }

    /// The negotiated API (`"v1"` or `"v1alpha2"`) and the runtime's name and version
    /// (e.g. `"containerd v1.7.0"`).
    pub async fn version(&self) -> Result<(String, String)> {
        let (api, version) = self.runtime.version().await?;
        Ok((
            api.as_str().to_owned(),
            format!("{} {}", version.runtime_name, version.runtime_version),
        ))
    }

    /// The negotiated API version (negotiating if needed).
    pub async fn api(&self) -> Result<CriApi> {
        Ok(self.runtime.api().await?)
    }

    /// The pods that run: those with a `SANDBOX_READY` sandbox (keyed by the sandbox's
    /// metadata namespace/name) or a `CONTAINER_RUNNING` container (keyed by the labels
    /// `io.kubernetes.pod.namespace`/`io.kubernetes.pod.name`). Every namespace.
    pub async fn running_pods(&self) -> Result<BTreeSet<PodId>> {
        let sandboxes = self
            .runtime
            .list_pod_sandbox(Some(proto::PodSandboxFilter {
                state: Some(proto::PodSandboxStateValue {
                    state: proto::SANDBOX_READY,
                }),
                ..Default::default()
            }))
            .await?;
        let containers = self
            .runtime
            .list_containers(Some(proto::ContainerFilter {
                state: Some(proto::ContainerStateValue {
                    state: proto::CONTAINER_RUNNING,
                }),
                ..Default::default()
            }))
            .await?;
        // The runtime filters; filter again in case it ignores the filter.
        let from_sandboxes = sandboxes
            .iter()
            .filter(|s| s.state == proto::SANDBOX_READY)
            .filter_map(|s| s.pod());
        let from_containers = containers
            .iter()
            .filter(|c| c.state == proto::CONTAINER_RUNNING)
            .filter_map(|c| c.pod());
        Ok(from_sandboxes
            .chain(from_containers)
            .map(|(namespace, name)| PodId::new(namespace, name))
            .collect())
    }

    /// Stops a pod like a crash would (see [`ckpt_cri::RuntimeClient::stop_pod`]); for
    /// end-to-end tests under the hollow kubelet.
    pub async fn stop_pod(&self, id: &PodId) -> Result<()> {
        self.runtime.stop_pod(&id.namespace, &id.name).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::testkit::FakeCri;

    const TIMEOUT: Duration = Duration::from_secs(2);

    #[tokio::test]
    async fn running_means_a_ready_sandbox_or_a_running_container() {
        let fake = FakeCri::start(true, false);
        fake.add_pod(
            "ns",
            "ready-and-running",
            proto::SANDBOX_READY,
            &[proto::CONTAINER_RUNNING],
        );
        fake.add_pod("ns", "ready-no-containers", proto::SANDBOX_READY, &[]);
        fake.add_pod(
            "ns",
            "container-only",
            proto::SANDBOX_NOTREADY,
            &[proto::CONTAINER_RUNNING],
        );
        fake.add_pod("ns", "dead", proto::SANDBOX_NOTREADY, &[proto::CONTAINER_EXITED]);
        fake.add_pod(
            "ns",
            "created",
            proto::SANDBOX_NOTREADY,
            &[proto::CONTAINER_CREATED],
        );
        let cri = CriClient::new(&fake.endpoint(), TIMEOUT).unwrap();
        let running = cri.running_pods().await.unwrap();
        let names: Vec<&str> = running.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            ["container-only", "ready-and-running", "ready-no-containers"]
        );
    }

    #[tokio::test]
    async fn version_api_and_stop_pod_go_through_the_runtime_client() {
        let fake = FakeCri::start(false, true);
        fake.add_pod("ns", "victim", proto::SANDBOX_READY, &[proto::CONTAINER_RUNNING]);
        let cri = CriClient::new(&fake.endpoint(), TIMEOUT).unwrap();
        assert_eq!(
            cri.version().await.unwrap(),
            ("v1alpha2".to_owned(), "fake 1.0".to_owned())
        );
        assert_eq!(cri.api().await.unwrap(), CriApi::V1alpha2);
        cri.stop_pod(&PodId::new("ns", "victim")).await.unwrap();
        assert!(cri.running_pods().await.unwrap().is_empty());
        let err = cri.stop_pod(&PodId::new("ns", "victim")).await.unwrap_err();
        assert!(
            matches!(err, Error::Cri(ckpt_cri::Error::PodNotRunning { .. })),
            "{err}"
        );
        let err = CriClient::new("relative.sock", TIMEOUT).unwrap_err();
        assert!(
            matches!(err, Error::Cri(ckpt_cri::Error::Endpoint { .. })),
            "{err}"
        );
    }
}
