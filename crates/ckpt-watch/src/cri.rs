//! Which pods run, as the CRI runtime says: [`ckpt_cri::RuntimeClient`] answers turned
//! into pod ids.

use std::collections::{BTreeMap, BTreeSet};
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

    /// The pods of these namespaces that run: those with a `CONTAINER_RUNNING` container
    /// (keyed by the labels `io.kubernetes.pod.namespace`/`io.kubernetes.pod.name`), with
    /// the ids of their running containers.
    ///
    /// A ready sandbox alone does not count: after a power cut the kubelet starts a
    /// parent's sandbox as soon as it sees the pod, while the container may wait for
    /// Secrets and ConfigMaps only the API server gives (`CreateContainerConfigError`); a
    /// checkpoint retired then takes the API server with it, and the parent never starts.
    ///
    /// The runtime is asked only for what is needed: running containers, one namespace at
    /// a time (the kubelet labels every container with its pod's namespace), so the
    /// answers stay small on a busy node whose other pods carry large annotations. One call
    /// per namespace.
    pub async fn running_pods<'a>(
        &self,
        namespaces: impl IntoIterator<Item = &'a str>,
    ) -> Result<BTreeMap<PodId, BTreeSet<String>>> {
        let mut running: BTreeMap<PodId, BTreeSet<String>> = BTreeMap::new();
        for namespace in namespaces {
            let selector = || [(LABEL_POD_NAMESPACE.to_owned(), namespace.to_owned())].into();
            // The runtime filters; filter again in case it ignores a filter.
            let in_namespace = |(ns, name): (&str, &str)| (ns == namespace).then(|| PodId::new(ns, name));
            let containers = self
                .runtime
                .list_containers(Some(proto::ContainerFilter {
                    state: Some(proto::ContainerStateValue {
                        state: proto::CONTAINER_RUNNING,
                    }),
                    label_selector: selector(),
                    ..Default::default()
                }))
                .await?;
            let found = (containers.iter())
                .filter(|c| c.state == proto::CONTAINER_RUNNING)
                .filter_map(|c| Some((in_namespace(c.pod()?)?, c.id.clone())));
            for (id, container) in found {
                running.entry(id).or_default().insert(container);
            }
        }
        Ok(running)
    }

    /// The restart count of each of these pods (namespace, name) that has a container: the
    /// highest attempt among its containers, whatever their state (a crash-looping
    /// container waits, exited, for its next start). One call per pod, selected by its
    /// labels; a pod without containers is left out.
    pub async fn restarts(&self, pods: &[(String, String)]) -> Result<BTreeMap<(String, String), u32>> {
        let mut counts = BTreeMap::new();
        for (namespace, name) in pods {
            let (namespace, name) = (namespace.as_str(), name.as_str());
            let selector = [
                (LABEL_POD_NAMESPACE.to_owned(), namespace.to_owned()),
                (LABEL_POD_NAME.to_owned(), name.to_owned()),
            ];
            let containers = self
                .runtime
                .list_containers(Some(proto::ContainerFilter {
                    label_selector: selector.into(),
                    ..Default::default()
                }))
                .await?;
            // The runtime filters; filter again in case it ignores a filter.
            let attempts = (containers.iter())
                .filter(|c| c.pod() == Some((namespace, name)))
                .map(|c| c.metadata.as_ref().map_or(0, |m| m.attempt));
            if let Some(highest) = attempts.max() {
                counts.insert((namespace.to_owned(), name.to_owned()), highest);
            }
        }
        Ok(counts)
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
    async fn running_means_a_running_container_not_a_ready_sandbox() {
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
        let running = cri.running_pods(["ns"]).await.unwrap();
        let names: Vec<&str> = running.keys().map(|p| &*p.name).collect();
        // A ready sandbox whose container is not running yet (its ConfigMap not synced
        // after a power cut) is not a running parent.
        assert_eq!(names, ["container-only", "ready-and-running"]);
    }

    #[tokio::test]
    async fn one_list_of_running_containers_per_namespace() {
        let fake = FakeCri::start(true, false);
        fake.add_pod("ns", "runs", proto::SANDBOX_READY, &[proto::CONTAINER_RUNNING]);
        fake.add_pod(
            "ns",
            "container-only",
            proto::SANDBOX_NOTREADY,
            &[proto::CONTAINER_RUNNING],
        );
        fake.add_pod("ns", "dead", proto::SANDBOX_NOTREADY, &[proto::CONTAINER_EXITED]);
        let cri = CriClient::new(&fake.endpoint(), TIMEOUT).unwrap();
        cri.api().await.unwrap();
        let lists = |fake: &FakeCri| -> Vec<String> {
            let calls = fake.calls();
            let names = calls
                .iter()
                .filter(|c| c.contains("/List"))
                .map(|c| c.rsplit('/').next().unwrap_or_default().to_owned());
            names.collect()
        };
        // Each with its running containers' ids, as the runtime names them.
        let expected: BTreeMap<PodId, BTreeSet<String>> = ["container-only", "runs"]
            .map(|n| (PodId::new("ns", n), BTreeSet::from([format!("ctr-ns-{n}-0")])))
            .into();
        let before = lists(&fake).len();
        let running = cri.running_pods(["ns"]).await.unwrap();
        assert_eq!(running, expected);
        assert_eq!(lists(&fake)[before..], ["ListContainers"]);
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
        assert!(cri.running_pods(["ns"]).await.unwrap().is_empty());
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

    /// Pads every sandbox and container of `ns` with an annotation of `bytes` bytes, as
    /// a busy node's pods carry (last-applied configurations, say).
    fn annotate(fake: &FakeCri, ns: &str, bytes: usize) {
        let mut st = fake.state.lock().unwrap();
        let pad = || [("pad".to_owned(), "x".repeat(bytes))].into();
        for s in st
            .sandboxes
            .iter_mut()
            .filter(|s| s.pod().is_some_and(|(n, _)| n == ns))
        {
            s.annotations = pad();
        }
        for c in st
            .containers
            .iter_mut()
            .filter(|c| c.pod().is_some_and(|(n, _)| n == ns))
        {
            c.annotations = pad();
        }
    }

    #[tokio::test]
    async fn a_busy_node_is_still_seen() {
        let fake = FakeCri::start(true, false);
        fake.add_pod(
            "kube-system",
            "apiserver",
            proto::SANDBOX_READY,
            &[proto::CONTAINER_RUNNING],
        );
        // 10 MiB of other namespaces' pods: over tonic's default 4 MiB limit.
        for i in 0..40 {
            fake.add_pod(
                "busy",
                &format!("p{i}"),
                proto::SANDBOX_READY,
                &[proto::CONTAINER_RUNNING],
            );
        }
        annotate(&fake, "busy", 256 * 1024);
        let cri = CriClient::new(&fake.endpoint(), TIMEOUT).unwrap();
        let running = cri.running_pods(["kube-system"]).await.unwrap();
        assert_eq!(
            running.keys().collect::<Vec<_>>(),
            [&PodId::new("kube-system", "apiserver")]
        );
        // Asked for, they are still read (up to the kubelet's 16 MiB).
        assert_eq!(cri.running_pods(["busy"]).await.unwrap().len(), 40);

        // Past 16 MiB in the namespace asked for: a clear error, not a wrong answer.
        annotate(&fake, "kube-system", ckpt_cri::MAX_ANSWER_BYTES);
        let err = cri.running_pods(["kube-system"]).await.unwrap_err();
        assert!(
            matches!(err, Error::Cri(ckpt_cri::Error::AnswerTooLarge { .. })),
            "{err}"
        );
        assert!(
            err.to_string().contains("answered more than 16777216 bytes"),
            "{err}"
        );

        // The local look says so: unknown, never "nothing runs", and counted (what the
        // agent's `/metrics` reports as `cri_answers_too_large_total`).
        let local = crate::LocalObserver::new(
            Some(CriClient::new(&fake.endpoint(), TIMEOUT).unwrap()),
            None,
            ckpt_core::NamespaceAllowList::new(["kube-system"]),
        );
        assert_eq!(local.cri_answers_too_large(), 0);
        assert_eq!(local.observe().await, ckpt_core::LocalView::Unknown);
        assert_eq!(local.observe().await, ckpt_core::LocalView::Unknown);
        assert_eq!(local.cri_answers_too_large(), 2);
    }
}
