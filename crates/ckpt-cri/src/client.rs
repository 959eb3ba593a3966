//! The `RuntimeService` client: tonic over a unix socket, API version negotiated.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::uri::PathAndQuery;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};
use tracing::{debug, info};

use crate::error::{Error, Result};
use crate::proto;
use crate::service::{ApiVersion, Method};

/// The version string sent in `VersionRequest` (what the kubelet sends).
const KUBELET_CRI_VERSION: &str = "0.1.0";

/// The largest answer read, as the kubelet allows its runtime (`maxMsgSize`, 16 MiB);
/// tonic's default of 4 MiB is too small for `ListPodSandbox` on a busy node, since every
/// sandbox carries its pod's labels and annotations.
pub const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;

/// The codec buffers' first size: CRI requests are tens of bytes and an idle node's
/// answers a few KiB (a buffer grows as needed). tonic's default of 8 KiB each way is, with
/// musl's allocator, two fresh mappings mapped and unmapped on every call: twice a second
/// for an idle agent.
const CODEC_BUFFER_BYTES: usize = 1024;
/// tonic's default: how much is encoded before the encoder yields.
const CODEC_YIELD_BYTES: usize = 32 * 1024;

/// prost's codec with [`CODEC_BUFFER_BYTES`] buffers.
struct SmallBuffers<Req, Resp>(std::marker::PhantomData<(Req, Resp)>);

impl<Req, Resp> tonic::codec::Codec for SmallBuffers<Req, Resp>
where
    Req: prost::Message + Send + 'static,
    Resp: prost::Message + Default + Send + 'static,
{
    type Encode = Req;
    type Decode = Resp;
    type Encoder = tonic_prost::ProstEncoder<Req>;
    type Decoder = tonic_prost::ProstDecoder<Resp>;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstCodec::<Req, Resp>::raw_encoder(buffer_settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstCodec::<Req, Resp>::raw_decoder(buffer_settings())
    }
}

fn buffer_settings() -> tonic::codec::BufferSettings {
    tonic::codec::BufferSettings::new(CODEC_BUFFER_BYTES, CODEC_YIELD_BYTES)
}

/// A CRI `RuntimeService` client over a unix socket.
///
/// The API version is negotiated on first use (`runtime.v1` `Version`; on
/// `Unimplemented`, `runtime.v1alpha2`, as the kubelet does) and cached with the
/// connection; a connection failure or timeout drops both, so the next call reconnects
/// and negotiates again (the runtime may have been restarted or upgraded). Every call is
/// bounded by the timeout, connection included.
pub struct RuntimeClient {
    socket: PathBuf,
    timeout: Duration,
    conn: tokio::sync::Mutex<Option<(Channel, ApiVersion)>>,
}

impl std::fmt::Debug for RuntimeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeClient")
            .field("socket", &self.socket)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// What [`RuntimeClient::stop_pod`] stopped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stopped {
    /// Containers stopped (those that had not exited).
    pub containers: usize,
    /// Sandboxes stopped (those that were ready).
    pub sandboxes: usize,
}

impl RuntimeClient {
    /// A client for `unix:///path/to/socket` (or a plain absolute `/path`). Nothing is
    /// dialled until the first call.
    pub fn new(endpoint: &str, timeout: Duration) -> Result<Self> {
        let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
        if !path.starts_with('/') {
            return Err(Error::Endpoint {
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

    /// The negotiated API version (negotiating if needed).
    pub async fn api(&self) -> Result<ApiVersion> {
        Ok(self.connection().await?.1)
    }

    /// `Version`: the negotiated API version and the runtime's answer.
    pub async fn version(&self) -> Result<(ApiVersion, proto::VersionResponse)> {
        let (channel, api) = self.connection().await?;
        let response = self
            .call(&channel, api, Method::Version, version_request())
            .await?;
        Ok((api, response))
    }

    /// `ListPodSandbox` with an optional filter (`None`: every sandbox).
    pub async fn list_pod_sandbox(
        &self,
        filter: Option<proto::PodSandboxFilter>,
    ) -> Result<Vec<proto::PodSandbox>> {
        let (channel, api) = self.connection().await?;
        let response: proto::ListPodSandboxResponse = self
            .call(
                &channel,
                api,
                Method::ListPodSandbox,
                proto::ListPodSandboxRequest { filter },
            )
            .await?;
        Ok(response.items)
    }

    /// `ListContainers` with an optional filter (`None`: every container).
    pub async fn list_containers(
        &self,
        filter: Option<proto::ContainerFilter>,
    ) -> Result<Vec<proto::Container>> {
        let (channel, api) = self.connection().await?;
        let response: proto::ListContainersResponse = self
            .call(
                &channel,
                api,
                Method::ListContainers,
                proto::ListContainersRequest { filter },
            )
            .await?;
        Ok(response.containers)
    }

    /// `StopContainer` with a grace period in seconds (0: killed at once).
    pub async fn stop_container(&self, container_id: &str, grace_seconds: i64) -> Result<()> {
        let (channel, api) = self.connection().await?;
        let _: proto::StopContainerResponse = self
            .call(
                &channel,
                api,
                Method::StopContainer,
                proto::StopContainerRequest {
                    container_id: container_id.to_owned(),
                    timeout: grace_seconds,
                },
            )
            .await?;
        Ok(())
    }

    /// `StopPodSandbox`.
    pub async fn stop_pod_sandbox(&self, pod_sandbox_id: &str) -> Result<()> {
        let (channel, api) = self.connection().await?;
        let _: proto::StopPodSandboxResponse = self
            .call(
                &channel,
                api,
                Method::StopPodSandbox,
                proto::StopPodSandboxRequest {
                    pod_sandbox_id: pod_sandbox_id.to_owned(),
                },
            )
            .await?;
        Ok(())
    }

    /// Stops a pod like a crash would: `StopContainer` (no grace period) for each of its
    /// containers that has not exited, then `StopPodSandbox` for each of its ready
    /// sandboxes. A container is the pod's when it runs in one of the pod's sandboxes or
    /// carries the pod's labels. Fails with [`Error::PodNotRunning`] when there is nothing
    /// to stop. Meant for tests (the kubelet, seeing a dead pod with `restartPolicy:
    /// Never`, leaves it dead).
    pub async fn stop_pod(&self, namespace: &str, name: &str) -> Result<Stopped> {
        let pod = Some((namespace, name));
        let sandboxes: Vec<proto::PodSandbox> = self
            .list_pod_sandbox(None)
            .await?
            .into_iter()
            .filter(|s| s.pod() == pod)
            .collect();
        let sandbox_ids: BTreeSet<&str> = sandboxes.iter().map(|s| s.id.as_str()).collect();
        let containers: Vec<proto::Container> = self
            .list_containers(None)
            .await?
            .into_iter()
            .filter(|c| sandbox_ids.contains(c.pod_sandbox_id.as_str()) || c.pod() == pod)
            .filter(|c| c.state != proto::CONTAINER_EXITED)
            .collect();
        let ready: Vec<&proto::PodSandbox> = sandboxes
            .iter()
            .filter(|s| s.state == proto::SANDBOX_READY)
            .collect();
        if containers.is_empty() && ready.is_empty() {
            return Err(Error::PodNotRunning {
                socket: self.socket.clone(),
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            });
        }
        for container in &containers {
            self.stop_container(&container.id, 0).await?;
        }
        for sandbox in &ready {
            self.stop_pod_sandbox(&sandbox.id).await?;
        }
        let stopped = Stopped {
            containers: containers.len(),
            sandboxes: ready.len(),
        };
        info!(
            pod = %format_args!("{namespace}/{name}"),
            containers = stopped.containers,
            sandboxes = stopped.sandboxes,
            "stopped pod through the CRI"
        );
        Ok(stopped)
    }

    /// The cached connection, or a new one with a negotiated API version.
    async fn connection(&self) -> Result<(Channel, ApiVersion)> {
        let mut conn = self.conn.lock().await;
        if let Some((channel, api)) = conn.as_ref() {
            return Ok((channel.clone(), *api));
        }
        let channel = self.channel();
        let mut negotiated = None;
        for api in ApiVersion::ALL {
            match self
                .call::<_, proto::VersionResponse>(&channel, api, Method::Version, version_request())
                .await
            {
                Ok(_) => {
                    negotiated = Some(api);
                    break;
                }
                Err(Error::Call { source, .. }) if source.code() == tonic::Code::Unimplemented => {}
                Err(e) => return Err(e),
            }
        }
        let Some(api) = negotiated else {
            return Err(Error::Unsupported {
                socket: self.socket.clone(),
            });
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
        api: ApiVersion,
        method: Method,
        request: Req,
    ) -> Result<Resp>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let path = method.path(api);
        let mut grpc = tonic::client::Grpc::new(channel.clone()).max_decoding_message_size(MAX_ANSWER_BYTES);
        let attempt = async {
            grpc.ready()
                .await
                .map_err(|e| tonic::Status::unavailable(format!("connection not ready: {e}")))?;
            let codec = SmallBuffers::<Req, Resp>(std::marker::PhantomData);
            grpc.unary(
                tonic::Request::new(request),
                PathAndQuery::from_static(path),
                codec,
            )
            .await
        };
        let (error, broken) = match tokio::time::timeout(self.timeout, attempt).await {
            Ok(Ok(response)) => return Ok(response.into_inner()),
            Ok(Err(status))
                if status.code() == tonic::Code::OutOfRange && status.message().contains("too large") =>
            {
                let error = Error::AnswerTooLarge {
                    socket: self.socket.clone(),
                    method: path,
                    limit: MAX_ANSWER_BYTES,
                };
                (error, false)
            }
            Ok(Err(status)) => {
                let broken = matches!(
                    status.code(),
                    tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
                );
                let error = Error::Call {
                    socket: self.socket.clone(),
                    method: path,
                    source: Box::new(status),
                };
                (error, broken)
            }
            Err(_) => {
                let error = Error::Timeout {
                    socket: self.socket.clone(),
                    method: path,
                    timeout: self.timeout,
                };
                (error, true)
            }
        };
        if broken {
            self.forget().await;
        }
        Err(error)
    }

    /// Drops the cached connection (unless it is being negotiated right now).
    async fn forget(&self) {
        if let Ok(mut conn) = self.conn.try_lock() {
            *conn = None;
        }
    }
}

fn version_request() -> proto::VersionRequest {
    proto::VersionRequest {
        version: KUBELET_CRI_VERSION.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(2);

    fn check(endpoint: &str, expected: Option<&str>) {
        match (RuntimeClient::new(endpoint, TIMEOUT), expected) {
            (Ok(client), Some(path)) => assert_eq!(client.socket(), Path::new(path), "{endpoint}"),
            (Err(Error::Endpoint { endpoint: e }), None) => assert_eq!(e, endpoint),
            (got, _) => panic!("{endpoint}: {got:?}"),
        }
    }

    #[test]
    fn endpoints() {
        let cases = [
            ("unix:///run/x.sock", Some("/run/x.sock")),
            ("/run/x.sock", Some("/run/x.sock")),
            ("", None),
            ("tcp://127.0.0.1:1", None),
            ("unix://relative.sock", None),
            ("relative.sock", None),
        ];
        for (endpoint, expected) in cases {
            check(endpoint, expected);
        }
    }
}
