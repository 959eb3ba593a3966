//! The fake CRI runtime: `ckpt-cri`'s messages served over a unix socket.

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use ckpt_cri::{ApiVersion, Method, proto};
use http::{Request, Response};
use tokio::task::JoinHandle;

use crate::lock;

/// What the fake runtime serves and holds.
#[derive(Default)]
pub struct CriState {
    /// Answers `runtime.v1`.
    pub serve_v1: bool,
    /// Answers `runtime.v1alpha2`.
    pub serve_v1alpha2: bool,
    /// The pod sandboxes.
    pub sandboxes: Vec<proto::PodSandbox>,
    /// The containers.
    pub containers: Vec<proto::Container>,
    /// gRPC paths called, in order.
    pub calls: Vec<String>,
    /// Each call is answered this late (a slow runtime); `None`: at once.
    pub delay: Option<std::time::Duration>,
    /// Connections accepted so far.
    pub accepted: usize,
    /// How each call fails, after `delay`; `None`: it is answered.
    pub fault: Option<CriFault>,
}

/// A misbehaving runtime: how the fake fails a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CriFault {
    /// Never answers (the call waits forever).
    Hang,
    /// The stream is reset (HTTP/2 `RST_STREAM`), as a runtime crashing mid-answer does.
    Reset,
    /// `Unimplemented` for the list calls (`Version` is answered): a runtime that dropped
    /// or never had them.
    Unimplemented,
    /// `Internal` for every call.
    Internal,
}

/// A CRI runtime on a unix socket in a temp dir.
pub struct FakeCri {
    _dir: Option<tempfile::TempDir>,
    /// The unix socket it listens on.
    pub socket: PathBuf,
    /// What it serves; change it at will.
    pub state: Arc<Mutex<CriState>>,
    task: JoinHandle<()>,
    connections: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl FakeCri {
    /// A runtime on a new socket in a temp dir, serving the given API versions.
    pub fn start(serve_v1: bool, serve_v1alpha2: bool) -> FakeCri {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut fake = Self::start_at(&dir.path().join("cri.sock"), serve_v1, serve_v1alpha2);
        fake._dir = Some(dir);
        fake
    }

    /// A runtime on a given socket path (e.g. where a stopped one was).
    pub fn start_at(socket: &std::path::Path, serve_v1: bool, serve_v1alpha2: bool) -> FakeCri {
        let socket = socket.to_path_buf();
        let state = Arc::new(Mutex::new(CriState {
            serve_v1,
            serve_v1alpha2,
            ..Default::default()
        }));
        let listener = tokio::net::UnixListener::bind(&socket).expect("bind unix socket");
        let shared = Arc::clone(&state);
        let shared_accepted = Arc::clone(&state);
        let connections: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let conns = Arc::clone(&connections);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let shared = Arc::clone(&shared);
                let conn = tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let shared = Arc::clone(&shared);
                        async move {
                            // An error from the service resets the stream.
                            match cri_handle(shared, req).await {
                                Some(response) => Ok(response),
                                None => Err(StreamReset),
                            }
                        }
                    });
                    let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
                lock(&conns).push(conn.abort_handle());
                lock(&shared_accepted).accepted += 1;
            }
        });
        FakeCri {
            _dir: None,
            socket,
            state,
            task,
            connections,
        }
    }

    /// Stops serving and removes the socket (the runtime went away).
    pub fn stop(&self) {
        self.task.abort();
        for conn in lock(&self.connections).drain(..) {
            conn.abort();
        }
        let _ = std::fs::remove_file(&self.socket);
    }

    /// The gRPC paths called so far, in order.
    pub fn calls(&self) -> Vec<String> {
        lock(&self.state).calls.clone()
    }

    /// Removes a pod's sandboxes and containers (the pod is gone, e.g. after a reboot).
    pub fn remove_pod(&self, ns: &str, name: &str) {
        let mut st = lock(&self.state);
        let sandbox_id = format!("sb-{ns}-{name}");
        st.sandboxes.retain(|s| s.id != sandbox_id);
        st.containers.retain(|c| c.pod_sandbox_id != sandbox_id);
    }

    /// Removes every pod (a rebooted node).
    pub fn clear(&self) {
        let mut st = lock(&self.state);
        st.sandboxes.clear();
        st.containers.clear();
    }

    /// The endpoint string for [`ckpt_cri::RuntimeClient::new`].
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// Sets the attempt (the kubelet's restart count) of a pod's containers, in the order
    /// they were added; containers past the given ones keep theirs.
    pub fn set_attempts(&self, ns: &str, name: &str, attempts: &[u32]) {
        let mut st = lock(&self.state);
        let sandbox_id = format!("sb-{ns}-{name}");
        let containers = st
            .containers
            .iter_mut()
            .filter(|c| c.pod_sandbox_id == sandbox_id);
        for (container, attempt) in containers.zip(attempts) {
            if let Some(meta) = container.metadata.as_mut() {
                meta.attempt = *attempt;
            }
        }
    }

    /// Adds a pod: a sandbox in `sandbox_state` and one container per given state.
    pub fn add_pod(&self, ns: &str, name: &str, sandbox_state: i32, container_states: &[i32]) {
        let mut st = lock(&self.state);
        let sandbox_id = format!("sb-{ns}-{name}");
        st.sandboxes.push(proto::PodSandbox {
            id: sandbox_id.clone(),
            metadata: Some(proto::PodSandboxMetadata {
                name: name.to_owned(),
                uid: format!("uid-{name}"),
                namespace: ns.to_owned(),
                attempt: 0,
            }),
            state: sandbox_state,
            labels: [
                (proto::LABEL_POD_NAMESPACE.to_owned(), ns.to_owned()),
                (proto::LABEL_POD_NAME.to_owned(), name.to_owned()),
            ]
            .into(),
            ..Default::default()
        });
        for (i, s) in container_states.iter().enumerate() {
            st.containers.push(proto::Container {
                id: format!("ctr-{ns}-{name}-{i}"),
                pod_sandbox_id: sandbox_id.clone(),
                metadata: Some(proto::ContainerMetadata {
                    name: format!("c{i}"),
                    attempt: 0,
                }),
                state: *s,
                labels: [
                    (proto::LABEL_POD_NAMESPACE.to_owned(), ns.to_owned()),
                    (proto::LABEL_POD_NAME.to_owned(), name.to_owned()),
                ]
                .into(),
                ..Default::default()
            });
        }
    }
}

impl Drop for FakeCri {
    fn drop(&mut self) {
        self.task.abort();
        for conn in lock(&self.connections).drain(..) {
            conn.abort();
        }
    }
}

/// A CRI label selector: every pair must be among the labels (as containerd matches).
fn selects(
    selector: &std::collections::BTreeMap<String, String>,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn grpc_unary<Req, Resp>(
    req: Request<hyper::body::Incoming>,
    f: impl FnOnce(Req) -> Resp + Send + 'static,
) -> impl Future<Output = Response<tonic::body::Body>>
where
    Req: prost::Message + Default + Send + 'static,
    Resp: prost::Message + Send + 'static,
{
    let f = Mutex::new(Some(f));
    let svc = tower::service_fn(move |r: tonic::Request<Req>| {
        let f = lock(&f).take();
        async move {
            let f = f.ok_or_else(|| tonic::Status::internal("called twice"))?;
            Ok::<_, tonic::Status>(tonic::Response::new(f(r.into_inner())))
        }
    });
    async move {
        let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::<Resp, Req>::default());
        grpc.unary(svc, req).await
    }
}

/// The error that makes the fake reset a stream ([`CriFault::Reset`]).
#[derive(Debug)]
struct StreamReset;

impl std::fmt::Display for StreamReset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stream reset by the fake runtime")
    }
}

impl std::error::Error for StreamReset {}

/// The answer to one call; `None` resets its stream.
async fn cri_handle(
    state: Arc<Mutex<CriState>>,
    req: Request<hyper::body::Incoming>,
) -> Option<Response<tonic::body::Body>> {
    let path = req.uri().path().to_owned();
    let (serve_v1, serve_v1alpha2, delay, fault) = {
        let mut st = lock(&state);
        st.calls.push(path.clone());
        (st.serve_v1, st.serve_v1alpha2, st.delay, st.fault)
    };
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    // Unknown paths and versions not served get what a real gRPC server sends.
    let Some((api, method)) = Method::parse(&path) else {
        return Some(tonic::Status::unimplemented(format!("unknown method {path}")).into_http());
    };
    match fault {
        Some(CriFault::Hang) => std::future::pending::<()>().await,
        Some(CriFault::Reset) => return None,
        Some(CriFault::Internal) => return Some(tonic::Status::internal("the runtime failed").into_http()),
        Some(CriFault::Unimplemented) if method != Method::Version => {
            return Some(tonic::Status::unimplemented(format!("unknown method {path}")).into_http());
        }
        Some(CriFault::Unimplemented) | None => {}
    }
    Some(cri_answer(state, req, api, method, serve_v1, serve_v1alpha2).await)
}

async fn cri_answer(
    state: Arc<Mutex<CriState>>,
    req: Request<hyper::body::Incoming>,
    api: ApiVersion,
    method: Method,
    serve_v1: bool,
    serve_v1alpha2: bool,
) -> Response<tonic::body::Body> {
    let served = match api {
        ApiVersion::V1 => serve_v1,
        ApiVersion::V1alpha2 => serve_v1alpha2,
    };
    if !served {
        return tonic::Status::unimplemented(format!("unknown service runtime.{api}.RuntimeService"))
            .into_http();
    }
    let st = Arc::clone(&state);
    match method {
        Method::Version => {
            grpc_unary(req, move |_: proto::VersionRequest| proto::VersionResponse {
                version: "0.1.0".into(),
                runtime_name: "fake".into(),
                runtime_version: "1.0".into(),
                runtime_api_version: api.as_str().to_owned(),
            })
            .await
        }
        Method::ListPodSandbox => {
            grpc_unary(req, move |r: proto::ListPodSandboxRequest| {
                let filter = r.filter.unwrap_or_default();
                let want = filter.state.map(|s| s.state);
                proto::ListPodSandboxResponse {
                    items: lock(&st)
                        .sandboxes
                        .iter()
                        .filter(|s| want.is_none_or(|w| w == s.state))
                        .filter(|s| selects(&filter.label_selector, &s.labels))
                        .cloned()
                        .collect(),
                }
            })
            .await
        }
        Method::ListContainers => {
            grpc_unary(req, move |r: proto::ListContainersRequest| {
                let filter = r.filter.unwrap_or_default();
                let want = filter.state.map(|s| s.state);
                proto::ListContainersResponse {
                    containers: lock(&st)
                        .containers
                        .iter()
                        .filter(|c| want.is_none_or(|w| w == c.state))
                        .filter(|c| selects(&filter.label_selector, &c.labels))
                        .cloned()
                        .collect(),
                }
            })
            .await
        }
        Method::StopContainer => {
            grpc_unary(req, move |r: proto::StopContainerRequest| {
                for c in lock(&st).containers.iter_mut().filter(|c| c.id == r.container_id) {
                    c.state = proto::CONTAINER_EXITED;
                }
                proto::StopContainerResponse {}
            })
            .await
        }
        Method::StopPodSandbox => {
            grpc_unary(req, move |r: proto::StopPodSandboxRequest| {
                for s in lock(&st)
                    .sandboxes
                    .iter_mut()
                    .filter(|s| s.id == r.pod_sandbox_id)
                {
                    s.state = proto::SANDBOX_NOTREADY;
                }
                proto::StopPodSandboxResponse {}
            })
            .await
        }
    }
}
