//! A minimal CRI client over a unix socket: which pods run, and stopping one (tests).

pub mod proto;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ckpt_core::PodId;
use http::uri::PathAndQuery;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};
use tracing::{debug, info};

use crate::error::{Error, Result};

/// The container label the kubelet puts the pod's namespace in.
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// The container label the kubelet puts the pod's name in.
pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";

/// The CRI API version a runtime speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CriApi {
    /// `runtime.v1` (Kubernetes ≥ 1.23, current runtimes).
    V1,
    /// `runtime.v1alpha2` (older runtimes, the hollow kubelet's fake runtime).
    V1alpha2,
}

impl CriApi {
    /// `v1` or `v1alpha2`.
    pub fn as_str(self) -> &'static str {
        match self {
            CriApi::V1 => "v1",
            CriApi::V1alpha2 => "v1alpha2",
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Method {
    Version,
    ListPodSandbox,
    ListContainers,
    StopContainer,
    StopPodSandbox,
}

impl Method {
    fn path(self, api: CriApi) -> &'static str {
        macro_rules! paths {
            ($($m:ident),*) => {
                match (api, self) {
                    $(
                        (CriApi::V1, Method::$m) => concat!("/runtime.v1.RuntimeService/", stringify!($m)),
                        (CriApi::V1alpha2, Method::$m) => {
                            concat!("/runtime.v1alpha2.RuntimeService/", stringify!($m))
                        }
                    )*
                }
            };
        }
        paths!(
            Version,
            ListPodSandbox,
            ListContainers,
            StopContainer,
            StopPodSandbox
        )
    }
}

/// The version string we send in `VersionRequest` (what the kubelet sends).
const KUBELET_CRI_VERSION: &str = "0.1.0";

/// A CRI `RuntimeService` client over a unix socket.
///
/// The API version is negotiated on first use (`runtime.v1` `Version`; on
/// `Unimplemented`, `runtime.v1alpha2`) and cached; a connection failure or timeout
/// drops the cached connection, so the next call reconnects and negotiates again (the
/// runtime may have been restarted or upgraded). Every call is bounded by the timeout,
/// connection included.
pub struct CriClient {
    socket: PathBuf,
    timeout: Duration,
    conn: tokio::sync::Mutex<Option<(Channel, CriApi)>>,
}

impl std::fmt::Debug for CriClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CriClient")
            .field("socket", &self.socket)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl CriClient {
    /// A client for `unix:///path/to/socket` (or a plain absolute `/path`). Nothing is
    /// dialled until the first call.
    pub fn new(endpoint: &str, timeout: Duration) -> Result<Self> {
        let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
        if !path.starts_with('/') {
            return Err(Error::CriEndpoint {
                endpoint: endpoint.to_owned(),
            });
        }
        Ok(Self {
            socket: PathBuf::from(path),
            timeout,
            conn: tokio::sync::Mutex::new(None),
        })
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The negotiated API (`"v1"` or `"v1alpha2"`) and the runtime's name and version
    /// (e.g. `"containerd v1.7.0"`).
    pub async fn version(&self) -> Result<(String, String)> {
        let (channel, api) = self.connection().await?;
        let resp: proto::VersionResponse = self
            .call(
                &channel,
                api,
                Method::Version,
                proto::VersionRequest {
                    version: KUBELET_CRI_VERSION.to_owned(),
                },
            )
            .await?;
        Ok((
            api.as_str().to_owned(),
            format!("{} {}", resp.runtime_name, resp.runtime_version),
        ))
    }

    /// The negotiated API version (negotiating if needed).
    pub async fn api(&self) -> Result<CriApi> {
        Ok(self.connection().await?.1)
    }

    /// The pods that run: those with a `SANDBOX_READY` sandbox (keyed by the sandbox's
    /// metadata namespace/name) or a `CONTAINER_RUNNING` container (keyed by the labels
    /// `io.kubernetes.pod.namespace`/`io.kubernetes.pod.name`). Every namespace.
    pub async fn running_pods(&self) -> Result<BTreeSet<PodId>> {
        let (channel, api) = self.connection().await?;
        let sandboxes: proto::ListPodSandboxResponse = self
            .call(
                &channel,
                api,
                Method::ListPodSandbox,
                proto::ListPodSandboxRequest {
                    filter: Some(proto::PodSandboxFilter {
                        state: Some(proto::PodSandboxStateValue {
                            state: proto::SANDBOX_READY,
                        }),
                        ..Default::default()
                    }),
                },
            )
            .await?;
        let containers: proto::ListContainersResponse = self
            .call(
                &channel,
                api,
                Method::ListContainers,
                proto::ListContainersRequest {
                    filter: Some(proto::ContainerFilter {
                        state: Some(proto::ContainerStateValue {
                            state: proto::CONTAINER_RUNNING,
                        }),
                        ..Default::default()
                    }),
                },
            )
            .await?;
        // The runtime filters; filter again in case it ignores the filter.
        let from_sandboxes = sandboxes
            .items
            .iter()
            .filter(|s| s.state == proto::SANDBOX_READY)
            .filter_map(sandbox_pod);
        let from_containers = containers
            .containers
            .iter()
            .filter(|c| c.state == proto::CONTAINER_RUNNING)
            .filter_map(|c| labels_pod(&c.labels));
        Ok(from_sandboxes.chain(from_containers).collect())
    }

    /// Stops a pod like a crash would: `StopContainer` (no grace period) for each of its
    /// containers that has not exited, then `StopPodSandbox` for each of its sandboxes.
    /// Meant for end-to-end tests under the hollow kubelet. Fails with
    /// [`Error::CriPodNotFound`] when the runtime knows nothing of the pod.
    pub async fn stop_pod(&self, id: &PodId) -> Result<()> {
        let (channel, api) = self.connection().await?;
        let sandboxes: proto::ListPodSandboxResponse = self
            .call(
                &channel,
                api,
                Method::ListPodSandbox,
                proto::ListPodSandboxRequest::default(),
            )
            .await?;
        let containers: proto::ListContainersResponse = self
            .call(
                &channel,
                api,
                Method::ListContainers,
                proto::ListContainersRequest::default(),
            )
            .await?;
        let sandbox_ids: BTreeSet<&str> = sandboxes
            .items
            .iter()
            .filter(|s| sandbox_pod(s).as_ref() == Some(id))
            .map(|s| s.id.as_str())
            .collect();
        let mine: Vec<&proto::Container> = containers
            .containers
            .iter()
            .filter(|c| {
                sandbox_ids.contains(c.pod_sandbox_id.as_str()) || labels_pod(&c.labels).as_ref() == Some(id)
            })
            .collect();
        if sandbox_ids.is_empty() && mine.is_empty() {
            return Err(Error::CriPodNotFound {
                socket: self.socket.clone(),
                pod: id.clone(),
            });
        }
        for c in mine.iter().filter(|c| c.state != proto::CONTAINER_EXITED) {
            let _: proto::StopContainerResponse = self
                .call(
                    &channel,
                    api,
                    Method::StopContainer,
                    proto::StopContainerRequest {
                        container_id: c.id.clone(),
                        timeout: 0,
                    },
                )
                .await?;
        }
        for sandbox in &sandbox_ids {
            let _: proto::StopPodSandboxResponse = self
                .call(
                    &channel,
                    api,
                    Method::StopPodSandbox,
                    proto::StopPodSandboxRequest {
                        pod_sandbox_id: (*sandbox).to_owned(),
                    },
                )
                .await?;
        }
        info!(pod = %id, containers = mine.len(), sandboxes = sandbox_ids.len(), "stopped pod through the CRI");
        Ok(())
    }

    /// The cached connection, or a new one with a negotiated API version.
    async fn connection(&self) -> Result<(Channel, CriApi)> {
        let mut conn = self.conn.lock().await;
        if let Some((channel, api)) = conn.as_ref() {
            return Ok((channel.clone(), *api));
        }
        let channel = self.channel();
        let request = || proto::VersionRequest {
            version: KUBELET_CRI_VERSION.to_owned(),
        };
        let api = match self
            .call::<_, proto::VersionResponse>(&channel, CriApi::V1, Method::Version, request())
            .await
        {
            Ok(_) => CriApi::V1,
            Err(Error::CriCall { source, .. }) if source.code() == tonic::Code::Unimplemented => {
                match self
                    .call::<_, proto::VersionResponse>(&channel, CriApi::V1alpha2, Method::Version, request())
                    .await
                {
                    Ok(_) => CriApi::V1alpha2,
                    Err(Error::CriCall { source, .. }) if source.code() == tonic::Code::Unimplemented => {
                        return Err(Error::CriUnsupported {
                            socket: self.socket.clone(),
                        });
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        };
        debug!(socket = %self.socket.display(), api = api.as_str(), "CRI API negotiated");
        *conn = Some((channel.clone(), api));
        Ok((channel, api))
    }

    /// A lazily connecting channel to the socket (HTTP/2 over the unix stream).
    fn channel(&self) -> Channel {
        let socket = self.socket.clone();
        let connector = tower::service_fn(move |_: http::Uri| {
            let socket = socket.clone();
            async move { UnixStream::connect(socket).await.map(TokioIo::new) }
        });
        // The URI only names the HTTP/2 authority; the connector ignores it.
        Endpoint::from_static("http://localhost")
            .connect_timeout(self.timeout)
            .timeout(self.timeout)
            .connect_with_connector_lazy(connector)
    }

    /// One unary call with the timeout; a connection-level failure drops the cached
    /// connection.
    async fn call<Req, Resp>(
        &self,
        channel: &Channel,
        api: CriApi,
        method: Method,
        request: Req,
    ) -> Result<Resp>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let path = method.path(api);
        let mut grpc = tonic::client::Grpc::new(channel.clone());
        let attempt = async {
            grpc.ready()
                .await
                .map_err(|e| tonic::Status::unavailable(format!("connection not ready: {e}")))?;
            let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
            grpc.unary(
                tonic::Request::new(request),
                PathAndQuery::from_static(path),
                codec,
            )
            .await
        };
        let outcome = tokio::time::timeout(self.timeout, attempt).await;
        let failure = match outcome {
            Ok(Ok(response)) => return Ok(response.into_inner()),
            Ok(Err(status)) => {
                let broken = matches!(
                    status.code(),
                    tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
                );
                (
                    Error::CriCall {
                        socket: self.socket.clone(),
                        method: path.to_owned(),
                        source: Box::new(status),
                    },
                    broken,
                )
            }
            Err(_) => (
                Error::CriTimeout {
                    socket: self.socket.clone(),
                    method: path.to_owned(),
                    timeout: self.timeout,
                },
                true,
            ),
        };
        if failure.1 {
            self.forget().await;
        }
        Err(failure.0)
    }

    /// Drops the cached connection (if it is not being negotiated right now).
    async fn forget(&self) {
        if let Ok(mut conn) = self.conn.try_lock() {
            *conn = None;
        }
    }
}

fn sandbox_pod(s: &proto::PodSandbox) -> Option<PodId> {
    match &s.metadata {
        Some(m) if !m.name.is_empty() && !m.namespace.is_empty() => Some(PodId::new(&m.namespace, &m.name)),
        _ => labels_pod(&s.labels),
    }
}

fn labels_pod(labels: &BTreeMap<String, String>) -> Option<PodId> {
    let ns = labels.get(LABEL_POD_NAMESPACE).filter(|v| !v.is_empty())?;
    let name = labels.get(LABEL_POD_NAME).filter(|v| !v.is_empty())?;
    Some(PodId::new(ns, name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::FakeCri;

    const TIMEOUT: Duration = Duration::from_secs(2);

    fn calls(fake: &FakeCri) -> Vec<String> {
        crate::reflect::lock(&fake.state).calls.clone()
    }

    #[test]
    fn endpoints() {
        assert_eq!(
            CriClient::new("unix:///run/x.sock", TIMEOUT).unwrap().socket(),
            Path::new("/run/x.sock")
        );
        assert_eq!(
            CriClient::new("/run/x.sock", TIMEOUT).unwrap().socket(),
            Path::new("/run/x.sock")
        );
        for bad in ["", "tcp://127.0.0.1:1", "unix://relative.sock", "relative.sock"] {
            let err = CriClient::new(bad, TIMEOUT).unwrap_err();
            assert!(matches!(err, Error::CriEndpoint { .. }), "{bad}: {err}");
        }
    }

    #[test]
    fn method_paths() {
        assert_eq!(
            Method::ListPodSandbox.path(CriApi::V1),
            "/runtime.v1.RuntimeService/ListPodSandbox"
        );
        assert_eq!(
            Method::StopPodSandbox.path(CriApi::V1alpha2),
            "/runtime.v1alpha2.RuntimeService/StopPodSandbox"
        );
    }

    #[tokio::test]
    async fn negotiates_v1_when_served() {
        let fake = FakeCri::start(true, true);
        let cri = CriClient::new(&fake.endpoint(), TIMEOUT).unwrap();
        assert_eq!(
            cri.version().await.unwrap(),
            ("v1".to_owned(), "fake 1.0".to_owned())
        );
        assert_eq!(
            calls(&fake),
            vec![
                "/runtime.v1.RuntimeService/Version",
                "/runtime.v1.RuntimeService/Version"
            ]
        );
    }

    #[tokio::test]
    async fn falls_back_to_v1alpha2_and_caches_the_choice() {
        let fake = FakeCri::start(false, true);
        let cri = CriClient::new(&fake.endpoint(), TIMEOUT).unwrap();
        assert_eq!(cri.api().await.unwrap(), CriApi::V1alpha2);
        cri.running_pods().await.unwrap();
        cri.running_pods().await.unwrap();
        let calls = calls(&fake);
        assert_eq!(
            calls[..2],
            [
                "/runtime.v1.RuntimeService/Version",
                "/runtime.v1alpha2.RuntimeService/Version"
            ]
        );
        assert!(
            calls[2..]
                .iter()
                .all(|c| c.starts_with("/runtime.v1alpha2.") && !c.ends_with("/Version")),
            "{calls:?}"
        );
        assert_eq!(cri.version().await.unwrap().0, "v1alpha2");
    }

    #[tokio::test]
    async fn a_runtime_serving_neither_version_is_unsupported() {
        let fake = FakeCri::start(false, false);
        let cri = CriClient::new(&fake.endpoint(), TIMEOUT).unwrap();
        let err = cri.running_pods().await.unwrap_err();
        assert!(matches!(err, Error::CriUnsupported { .. }), "{err}");
    }

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
    async fn stop_pod_stops_its_containers_then_its_sandbox() {
        let fake = FakeCri::start(false, true);
        fake.add_pod(
            "ns",
            "victim",
            proto::SANDBOX_READY,
            &[proto::CONTAINER_RUNNING, proto::CONTAINER_RUNNING],
        );
        fake.add_pod(
            "ns",
            "bystander",
            proto::SANDBOX_READY,
            &[proto::CONTAINER_RUNNING],
        );
        let cri = CriClient::new(&fake.endpoint(), TIMEOUT).unwrap();
        cri.stop_pod(&PodId::new("ns", "victim")).await.unwrap();
        let running = cri.running_pods().await.unwrap();
        assert_eq!(
            running.into_iter().collect::<Vec<_>>(),
            vec![PodId::new("ns", "bystander")]
        );
        let stops: Vec<String> = calls(&fake).into_iter().filter(|c| c.contains("/Stop")).collect();
        assert_eq!(
            stops,
            [
                "/runtime.v1alpha2.RuntimeService/StopContainer",
                "/runtime.v1alpha2.RuntimeService/StopContainer",
                "/runtime.v1alpha2.RuntimeService/StopPodSandbox"
            ]
        );
        let err = cri.stop_pod(&PodId::new("ns", "nobody")).await.unwrap_err();
        assert!(matches!(err, Error::CriPodNotFound { .. }), "{err}");
    }

    #[tokio::test]
    async fn a_vanished_runtime_is_an_error_and_a_new_one_is_renegotiated() {
        let fake = FakeCri::start(true, false);
        let cri = CriClient::new(&fake.endpoint(), TIMEOUT).unwrap();
        assert_eq!(cri.api().await.unwrap(), CriApi::V1);
        fake.stop();
        let err = cri.running_pods().await.unwrap_err();
        assert!(
            matches!(err, Error::CriCall { .. } | Error::CriTimeout { .. }),
            "{}",
            err.chain()
        );
        assert!(
            err.to_string().contains(&fake.socket.display().to_string()),
            "{err}"
        );

        // An older runtime comes up on the same socket: the client renegotiates.
        let replacement = FakeCri::start_at(&fake.socket, false, true);
        replacement.add_pod("ns", "p", proto::SANDBOX_READY, &[]);
        assert_eq!(cri.running_pods().await.unwrap().len(), 1);
        assert_eq!(cri.api().await.unwrap(), CriApi::V1alpha2);
    }

    #[tokio::test]
    async fn a_runtime_that_never_answers_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("hung.sock");
        // Bound but never accepted: the connection sits in the backlog.
        let _listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let cri = CriClient::new(socket.to_str().unwrap(), Duration::from_millis(200)).unwrap();
        let started = tokio::time::Instant::now();
        let err = cri.running_pods().await.unwrap_err();
        assert!(
            matches!(err, Error::CriTimeout { .. } | Error::CriCall { .. }),
            "{}",
            err.chain()
        );
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }
}
