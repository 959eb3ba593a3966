//! Test doubles for everything `ckpt-watch` observes: a fake API server (kube's
//! `tower-test` pattern: a mock service behind a real [`kube::Client`]), a fake CRI
//! runtime (gRPC over a unix socket) and a fake kubelet (HTTP/1 on 127.0.0.1, optionally
//! TLS).
//!
//! Compiled for this crate's own tests, and for other crates' tests with the `testkit`
//! feature (`ckpt-bin`'s in-process agent tests dev-depend on it). It lives here rather
//! than in a crate of its own because it needs this crate's CRI messages and because a
//! separate crate that depends on `ckpt-watch` could not be used by `ckpt-watch`'s own
//! unit tests without building the crate twice. Never enable the feature in a build that
//! ships: the doubles accept anything and panic on misuse.
//!
//! Waiting helpers ([`within`], [`wait_until`]) fail the test after a generous timeout
//! instead of asserting timings.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::channel::mpsc;
use http::{Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::cri::proto;
use crate::reflect::lock;

/// Fails the test if `fut` does not finish within `secs` seconds.
pub async fn within<T>(secs: u64, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(secs), fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {secs}s waiting for {what}"),
    }
}

/// Polls `cond` on every bump of `rx` (and every 10 ms) until it holds; panics after `secs`.
pub async fn wait_until(secs: u64, what: &str, mut rx: watch::Receiver<u64>, mut cond: impl FnMut() -> bool) {
    within(secs, what, async {
        while !cond() {
            let _ = tokio::time::timeout(Duration::from_millis(10), rx.changed()).await;
        }
    })
    .await;
}

// ---------------------------------------------------------------------------------------
// Fake API server
// ---------------------------------------------------------------------------------------

type MockBody = BoxBody<Bytes, Infallible>;
type Frames = mpsc::UnboundedSender<Result<Frame<Bytes>, Infallible>>;

/// How the fake answers a kind of request.
#[derive(Clone, Debug)]
pub enum Reply {
    /// Normal behaviour: the objects, an open watch stream, `ok` for `/readyz`.
    Normal,
    /// An HTTP status with a `Status` body.
    Status(u16),
    /// Accept the request, never answer (a hung server).
    Hang,
    /// Fail the request at once, as a closed port does (a killed server).
    Refuse,
}

/// One request the fake saw.
#[derive(Clone, Debug)]
pub struct Seen {
    /// `GET`, `POST`, …
    pub method: String,
    /// The URL path.
    pub path: String,
    /// The URL query, without `?`.
    pub query: String,
}

impl Seen {
    /// Whether this is a watch request.
    pub fn is_watch(&self) -> bool {
        self.query.contains("watch=true")
    }
}

#[derive(Default)]
struct FakeState {
    /// When set, every request gets this answer (a whole-server outage).
    outage: Option<Reply>,
    /// Scripted `/readyz` answers, then `readyz`.
    readyz_script: VecDeque<Reply>,
    readyz: Option<Reply>,
    /// Objects by (resource, namespace).
    objects: BTreeMap<(String, String), Vec<Value>>,
    /// List answers by (resource, namespace); default Normal.
    lists: BTreeMap<(String, String), Reply>,
    /// Watch answers by (resource, namespace); default Normal (an open stream).
    watches: BTreeMap<(String, String), Reply>,
    /// Open watch streams: (resource, namespace, name selector) → frames.
    streams: Vec<(String, String, Option<String>, Frames)>,
    /// Answers to plain GETs by path.
    gets: BTreeMap<String, (u16, Value)>,
    /// Requests left unanswered.
    parked: Vec<tower_test::mock::SendResponse<Response<MockBody>>>,
    log: Vec<Seen>,
    resource_version: u64,
}

/// A fake Kubernetes API behind a real `kube::Client`.
///
/// Answers `/readyz`, lists and watches of `/api/v1/namespaces/<ns>/<resource>` (with
/// `fieldSelector=metadata.name=…`), and plain GETs set with [`FakeApi::set_get`];
/// anything else is a 404. Every request is logged.
#[derive(Clone)]
pub struct FakeApi {
    state: Arc<Mutex<FakeState>>,
    requests: watch::Sender<u64>,
}

/// A `Status` object as the API server sends with an error.
pub fn status_body(code: u16, message: &str) -> Value {
    let reason = match code {
        403 => "Forbidden",
        404 => "NotFound",
        410 => "Expired",
        _ => "InternalError",
    };
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

fn respond_json(code: u16, body: &Value) -> Response<MockBody> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .expect("valid response")
}

fn query_param(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| v.replace("%3D", "=").replace("%2F", "/"))
    })
}

impl FakeApi {
    /// A client talking to a new fake.
    pub fn start() -> (kube::Client, FakeApi, JoinHandle<()>) {
        let (service, mut handle) =
            tower_test::mock::pair::<Request<kube::client::Body>, Response<MockBody>>();
        let (requests, _) = watch::channel(0);
        let fake = FakeApi {
            state: Arc::new(Mutex::new(FakeState::default())),
            requests,
        };
        let server = fake.clone();
        let task = tokio::spawn(async move {
            while let Some((request, send)) = handle.next_request().await {
                server.handle(&request, send);
            }
        });
        (kube::Client::new(service, "default"), fake, task)
    }

    fn handle(
        &self,
        request: &Request<kube::client::Body>,
        send: tower_test::mock::SendResponse<Response<MockBody>>,
    ) {
        let seen = Seen {
            method: request.method().to_string(),
            path: request.uri().path().to_owned(),
            query: request.uri().query().unwrap_or("").to_owned(),
        };
        let mut st = lock(&self.state);
        st.log.push(seen.clone());
        match answer(&mut st, &seen) {
            Answer::Respond(response) => send.send_response(response),
            Answer::Park => st.parked.push(send),
            // Dropping the responder fails the request, as a closed port would.
            Answer::Refuse => drop(send),
        }
        drop(st);
        self.requests.send_modify(|n| *n += 1);
    }

    /// A receiver bumped on every request.
    pub fn requests(&self) -> watch::Receiver<u64> {
        self.requests.subscribe()
    }

    /// The requests so far.
    pub fn log(&self) -> Vec<Seen> {
        lock(&self.state).log.clone()
    }

    /// How many requests so far match `pred`.
    pub fn count(&self, pred: impl Fn(&Seen) -> bool) -> usize {
        lock(&self.state).log.iter().filter(|s| pred(s)).count()
    }

    /// Waits until `n` requests match `pred`.
    pub async fn wait_requests(&self, n: usize, what: &str, pred: impl Fn(&Seen) -> bool) {
        wait_until(5, what, self.requests(), || self.count(&pred) >= n).await;
    }

    /// Sets the objects of a resource in a namespace (served by later lists).
    pub fn set_objects(&self, resource: &str, ns: &str, objects: Vec<Value>) {
        lock(&self.state)
            .objects
            .insert((resource.to_owned(), ns.to_owned()), objects);
    }

    /// Sets how lists of a resource in a namespace are answered.
    pub fn set_list(&self, resource: &str, ns: &str, reply: Reply) {
        lock(&self.state)
            .lists
            .insert((resource.to_owned(), ns.to_owned()), reply);
    }

    /// Sets how watches of a resource in a namespace are answered.
    pub fn set_watch(&self, resource: &str, ns: &str, reply: Reply) {
        lock(&self.state)
            .watches
            .insert((resource.to_owned(), ns.to_owned()), reply);
    }

    /// Queues `/readyz` answers (used before the default).
    pub fn script_readyz(&self, replies: impl IntoIterator<Item = Reply>) {
        lock(&self.state).readyz_script.extend(replies);
    }

    /// Sets the default `/readyz` answer.
    pub fn set_readyz(&self, reply: Reply) {
        lock(&self.state).readyz = Some(reply);
    }

    /// Answers a plain GET of `path` (`code` 0 = hang).
    pub fn set_get(&self, path: &str, code: u16, body: Value) {
        lock(&self.state).gets.insert(path.to_owned(), (code, body));
    }

    /// Drops every unanswered request (a resumed server closes what hung).
    pub fn drop_parked(&self) -> usize {
        let parked = std::mem::take(&mut lock(&self.state).parked);
        parked.len()
    }

    /// How many requests hang unanswered.
    pub fn parked(&self) -> usize {
        lock(&self.state).parked.len()
    }

    /// Sends a watch event to the open streams of (resource, ns) whose name selector
    /// matches the object; returns how many streams got it.
    pub fn push_event(&self, resource: &str, ns: &str, event_type: &str, object: &Value) -> usize {
        let line = json!({"type": event_type, "object": object}).to_string() + "\n";
        let obj_name = object["metadata"]["name"].as_str().map(str::to_owned);
        let mut st = lock(&self.state);
        st.streams.retain(|(_, _, _, tx)| !tx.is_closed());
        let mut sent = 0;
        for (r, n, name, tx) in &st.streams {
            if r == resource && n == ns && (name.is_none() || *name == obj_name) {
                let frame = Frame::data(Bytes::from(line.clone()));
                if tx.unbounded_send(Ok(frame)).is_ok() {
                    sent += 1;
                }
            }
        }
        sent
    }

    /// A whole-server outage: every request (probe, lists, watches, GETs) gets `reply`
    /// until [`FakeApi::end_outage`]. With [`Reply::Refuse`] the open watch streams are
    /// closed too (a killed server drops its connections); with [`Reply::Hang`] they stay
    /// open and silent (a SIGSTOPped one). [`Reply::Normal`] is the same as ending it.
    pub fn set_outage(&self, reply: Reply) {
        let mut st = lock(&self.state);
        match reply {
            Reply::Normal => {
                st.outage = None;
                return;
            }
            Reply::Refuse => st.streams.clear(),
            Reply::Hang | Reply::Status(_) => {}
        }
        st.outage = Some(reply);
    }

    /// Ends an outage: requests are answered again; those that hung fail (the resumed
    /// server's connections were reset), so clients retry.
    pub fn end_outage(&self) {
        let mut st = lock(&self.state);
        st.outage = None;
        st.parked.clear();
    }

    /// Adds or replaces an object (by name) of a resource in a namespace, with a new
    /// resourceVersion, and sends `ADDED`/`MODIFIED` to the open watches.
    pub fn apply(&self, resource: &str, ns: &str, mut object: Value) {
        let rv = self.next_rv();
        object["metadata"]["resourceVersion"] = Value::from(rv);
        let name = object["metadata"]["name"].clone();
        let existed = {
            let mut st = lock(&self.state);
            let objects = st
                .objects
                .entry((resource.to_owned(), ns.to_owned()))
                .or_default();
            let existed = objects.iter().any(|o| o["metadata"]["name"] == name);
            objects.retain(|o| o["metadata"]["name"] != name);
            objects.push(object.clone());
            existed
        };
        let event = if existed { "MODIFIED" } else { "ADDED" };
        self.push_event(resource, ns, event, &object);
    }

    /// Removes an object by name and sends `DELETED` to the open watches; false if it
    /// was not there.
    pub fn delete(&self, resource: &str, ns: &str, name: &str) -> bool {
        let removed = {
            let mut st = lock(&self.state);
            let objects = st
                .objects
                .entry((resource.to_owned(), ns.to_owned()))
                .or_default();
            let at = objects.iter().position(|o| o["metadata"]["name"] == name);
            at.map(|i| objects.remove(i))
        };
        match removed {
            Some(mut object) => {
                object["metadata"]["resourceVersion"] = Value::from(self.next_rv());
                self.push_event(resource, ns, "DELETED", &object);
                true
            }
            None => false,
        }
    }

    /// The next resourceVersion.
    pub fn next_rv(&self) -> String {
        let mut st = lock(&self.state);
        st.resource_version += 1;
        st.resource_version.to_string()
    }
}

/// What the fake does with one request.
enum Answer {
    Respond(Response<MockBody>),
    Park,
    Refuse,
}

fn answer_with(reply: Reply, normal: impl FnOnce() -> Response<MockBody>, refusal: &str) -> Answer {
    match reply {
        Reply::Normal => Answer::Respond(normal()),
        Reply::Status(code) => Answer::Respond(respond_json(code, &status_body(code, refusal))),
        Reply::Hang => Answer::Park,
        Reply::Refuse => Answer::Refuse,
    }
}

fn answer(st: &mut FakeState, seen: &Seen) -> Answer {
    if let Some(outage) = st.outage.clone() {
        return match outage {
            Reply::Status(code) => Answer::Respond(respond_json(code, &status_body(code, "outage"))),
            Reply::Hang => Answer::Park,
            // `set_outage` never stores `Normal`.
            Reply::Normal | Reply::Refuse => Answer::Refuse,
        };
    }
    if seen.path == "/readyz" {
        let reply = st
            .readyz_script
            .pop_front()
            .or_else(|| st.readyz.clone())
            .unwrap_or(Reply::Normal);
        let ok = || {
            Response::builder()
                .status(200)
                .body(Full::new(Bytes::from_static(b"ok")).boxed())
                .expect("valid")
        };
        return answer_with(reply, ok, "readyz says no");
    }
    let segments: Vec<&str> = seen.path.trim_start_matches('/').split('/').collect();
    if let ["api", "v1", "namespaces", ns, resource] = segments.as_slice() {
        let key = ((*resource).to_owned(), (*ns).to_owned());
        let name = query_param(&seen.query, "fieldSelector")
            .and_then(|s| s.strip_prefix("metadata.name=").map(str::to_owned));
        if seen.is_watch() {
            let reply = st.watches.get(&key).cloned().unwrap_or(Reply::Normal);
            let open = || {
                let (tx, rx) = mpsc::unbounded();
                st.streams.push((key.0.clone(), key.1.clone(), name.clone(), tx));
                Response::builder()
                    .status(200)
                    .body(BodyExt::boxed(StreamBody::new(rx)))
                    .expect("valid")
            };
            return answer_with(reply, open, "watch refused");
        }
        let reply = st.lists.get(&key).cloned().unwrap_or(Reply::Normal);
        let list = || {
            st.resource_version += 1;
            let items: Vec<Value> = st
                .objects
                .get(&key)
                .into_iter()
                .flatten()
                .filter(|o| name.as_ref().is_none_or(|n| o["metadata"]["name"] == n.as_str()))
                .cloned()
                .collect();
            let body = json!({"apiVersion": "v1", "kind": "List",
                "metadata": {"resourceVersion": st.resource_version.to_string()}, "items": items});
            respond_json(200, &body)
        };
        return answer_with(
            reply,
            list,
            &format!("{resource} is forbidden: User \"agent\" cannot list"),
        );
    }
    match st.gets.get(&seen.path) {
        Some((0, _)) => Answer::Park,
        Some((code, body)) => Answer::Respond(respond_json(*code, body)),
        None => Answer::Respond(respond_json(404, &status_body(404, "not found"))),
    }
}

/// A pod object on `node`.
pub fn pod_json(ns: &str, name: &str, node: &str, annotations: &[(&str, &str)]) -> Value {
    let ann: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Value::from(*v)))
        .collect();
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"), "resourceVersion": "1",
                     "annotations": ann},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "img"}]}})
}

// ---------------------------------------------------------------------------------------
// Fake CRI runtime
// ---------------------------------------------------------------------------------------

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
        let connections: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let conns = Arc::clone(&connections);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let shared = Arc::clone(&shared);
                let conn = tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let shared = Arc::clone(&shared);
                        async move { Ok::<_, Infallible>(cri_handle(shared, req).await) }
                    });
                    let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
                lock(&conns).push(conn.abort_handle());
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

    /// The endpoint string for [`crate::CriClient::new`].
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
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
                    (crate::cri::LABEL_POD_NAMESPACE.to_owned(), ns.to_owned()),
                    (crate::cri::LABEL_POD_NAME.to_owned(), name.to_owned()),
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

async fn cri_handle(
    state: Arc<Mutex<CriState>>,
    req: Request<hyper::body::Incoming>,
) -> Response<tonic::body::Body> {
    let path = req.uri().path().to_owned();
    let (serve_v1, serve_v1alpha2) = {
        let mut st = lock(&state);
        st.calls.push(path.clone());
        (st.serve_v1, st.serve_v1alpha2)
    };
    let Some((api, method)) = path
        .strip_prefix("/runtime.")
        .and_then(|p| p.split_once(".RuntimeService/"))
    else {
        return tonic::Status::unimplemented("unknown path").into_http();
    };
    let served = match api {
        "v1" => serve_v1,
        "v1alpha2" => serve_v1alpha2,
        _ => false,
    };
    if !served {
        return tonic::Status::unimplemented(format!("unknown service runtime.{api}.RuntimeService"))
            .into_http();
    }
    let api = api.to_owned();
    let st = Arc::clone(&state);
    match method {
        "Version" => {
            grpc_unary(req, move |_: proto::VersionRequest| proto::VersionResponse {
                version: "0.1.0".into(),
                runtime_name: "fake".into(),
                runtime_version: "1.0".into(),
                runtime_api_version: api,
            })
            .await
        }
        "ListPodSandbox" => {
            grpc_unary(req, move |r: proto::ListPodSandboxRequest| {
                let want = r.filter.and_then(|f| f.state).map(|s| s.state);
                proto::ListPodSandboxResponse {
                    items: lock(&st)
                        .sandboxes
                        .iter()
                        .filter(|s| want.is_none_or(|w| w == s.state))
                        .cloned()
                        .collect(),
                }
            })
            .await
        }
        "ListContainers" => {
            grpc_unary(req, move |r: proto::ListContainersRequest| {
                let want = r.filter.and_then(|f| f.state).map(|s| s.state);
                proto::ListContainersResponse {
                    containers: lock(&st)
                        .containers
                        .iter()
                        .filter(|c| want.is_none_or(|w| w == c.state))
                        .cloned()
                        .collect(),
                }
            })
            .await
        }
        "StopContainer" => {
            grpc_unary(req, move |r: proto::StopContainerRequest| {
                for c in lock(&st).containers.iter_mut().filter(|c| c.id == r.container_id) {
                    c.state = proto::CONTAINER_EXITED;
                }
                proto::StopContainerResponse {}
            })
            .await
        }
        "StopPodSandbox" => {
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
        _ => tonic::Status::unimplemented(format!("unknown method {method}")).into_http(),
    }
}

// ---------------------------------------------------------------------------------------
// Fake kubelet
// ---------------------------------------------------------------------------------------

/// What the fake kubelet answers and saw.
#[derive(Default)]
pub struct KubeletState {
    /// Status to answer `/pods/` with (200 = the pod list).
    pub status: u16,
    /// The pods `/pods/` lists.
    pub pods: Vec<Value>,
    /// `Authorization` headers seen, one per request (`None` when absent).
    pub auth: Vec<Option<String>>,
    /// Paths requested.
    pub paths: Vec<String>,
}

/// A kubelet on `127.0.0.1:<random port>`, plain HTTP or TLS with the test certificate.
pub struct FakeKubelet {
    /// `http://127.0.0.1:<port>` or `https://…`.
    pub url: String,
    /// What it answers and saw; change it at will.
    pub state: Arc<Mutex<KubeletState>>,
    task: JoinHandle<()>,
    connections: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

/// The CA that signed the fake kubelet's certificate (PEM).
pub const TEST_CA_PEM: &str = include_str!("testdata/ca.pem");
const TEST_CERT_PEM: &str = include_str!("testdata/kubelet.pem");
const TEST_KEY_PEM: &str = include_str!("testdata/kubelet.key");

fn tls_acceptor() -> tokio_rustls::TlsAcceptor {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = vec![CertificateDer::from_pem_slice(TEST_CERT_PEM.as_bytes()).expect("test cert")];
    let key = PrivateKeyDer::from_pem_slice(TEST_KEY_PEM.as_bytes()).expect("test key");
    let config =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("server config");
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

impl FakeKubelet {
    /// A kubelet on a random port; with `tls`, its certificate is signed by
    /// [`TEST_CA_PEM`].
    pub async fn start(tls: bool) -> FakeKubelet {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let state = Arc::new(Mutex::new(KubeletState {
            status: 200,
            ..Default::default()
        }));
        let shared = Arc::clone(&state);
        let acceptor = tls.then(tls_acceptor);
        let connections: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let conns = Arc::clone(&connections);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let shared = Arc::clone(&shared);
                let acceptor = acceptor.clone();
                let conn = tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let shared = Arc::clone(&shared);
                        async move { Ok::<_, Infallible>(kubelet_handle(&shared, &req)) }
                    });
                    let builder = hyper::server::conn::http1::Builder::new();
                    match acceptor {
                        Some(acceptor) => {
                            if let Ok(tls) = acceptor.accept(stream).await {
                                let _ = builder
                                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                                    .await;
                            }
                        }
                        None => {
                            let _ = builder
                                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                                .await;
                        }
                    }
                });
                lock(&conns).push(conn.abort_handle());
            }
        });
        let scheme = if tls { "https" } else { "http" };
        FakeKubelet {
            url: format!("{scheme}://127.0.0.1:{port}"),
            state,
            task,
            connections,
        }
    }

    /// How many requests it got.
    pub fn requests(&self) -> usize {
        lock(&self.state).paths.len()
    }

    /// Stops listening and closes the open connections (the kubelet went away).
    pub fn stop(&self) {
        self.task.abort();
        for conn in lock(&self.connections).drain(..) {
            conn.abort();
        }
    }

    /// Answers `/pods/` with this status from now on (200 = the pod list).
    pub fn set_status(&self, status: u16) {
        lock(&self.state).status = status;
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        self.stop();
    }
}

fn kubelet_handle(
    state: &Mutex<KubeletState>,
    req: &Request<hyper::body::Incoming>,
) -> Response<Full<Bytes>> {
    let mut st = lock(state);
    st.paths.push(req.uri().path().to_owned());
    st.auth.push(
        req.headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    );
    let (code, body) = if req.uri().path() != "/pods/" {
        (404, "404 page not found".to_owned())
    } else if st.status == 200 {
        (
            200,
            json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": st.pods}).to_string(),
        )
    } else {
        (
            st.status,
            "Forbidden (user=system:serviceaccount:kube-system:pod-checkpointer, verb=get, resource=nodes, subresource=proxy)"
                .to_owned(),
        )
    };
    Response::builder()
        .status(code)
        .body(Full::new(Bytes::from(body)))
        .expect("valid response")
}
