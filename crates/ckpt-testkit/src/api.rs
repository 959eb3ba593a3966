//! The fake API server.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::channel::mpsc;
use http::{Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tower::ServiceExt;

use crate::{lock, wait_until};

type MockBody = BoxBody<Bytes, Infallible>;
type MockService = tower_test::mock::Mock<Request<kube::client::Body>, Response<MockBody>>;
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
    /// The request body (empty for a GET).
    pub body: String,
}

impl Seen {
    /// Whether this is a watch request.
    pub fn is_watch(&self) -> bool {
        self.query.contains("watch=true")
    }

    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
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
    /// Answers to GETs of one object by (resource, namespace); default Normal (the object,
    /// or a 404).
    object_gets: BTreeMap<(String, String), Reply>,
    /// Open watch streams: (resource, namespace, name selector) → frames.
    streams: Vec<(String, String, Option<String>, Frames)>,
    /// Answers to plain GETs by path.
    gets: BTreeMap<String, (u16, Value)>,
    /// How Event writes (`events.k8s.io/v1` POST and PATCH) are answered; default Normal
    /// (the body echoed back, as created).
    event_writes: Option<Reply>,
    /// Answers for the next Event writes, before `event_writes`.
    event_writes_script: VecDeque<Reply>,
    /// Requests left unanswered.
    parked: Vec<tower_test::mock::SendResponse<Response<MockBody>>>,
    log: Vec<Seen>,
    resource_version: u64,
}

/// A fake Kubernetes API behind a real `kube::Client`.
///
/// Answers `/readyz`, lists and watches of `/api/v1/namespaces/<ns>/<resource>` (with
/// `fieldSelector=metadata.name=…`), GETs of one of those objects
/// (`…/<resource>/<name>`, see [`FakeApi::set_object_get`]), `events.k8s.io/v1` Event
/// creates and patches (see
/// [`FakeApi::set_event_writes`]), and plain GETs set with [`FakeApi::set_get`];
/// anything else is a 404. Every request is logged, with its body.
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
        let (service, fake, task) = FakeApi::answering();
        (kube::Client::new(service, "default"), fake, task)
    }

    /// A new fake served over plain HTTP/1.1 on `127.0.0.1:<random port>`, for tests
    /// that need a real connection to break (a [`crate::FaultProxy`] in front of it).
    /// Requests are answered as by [`FakeApi::start`]'s; [`Reply::Refuse`] closes the
    /// request's connection. Aborting the task stops listening.
    pub async fn serve() -> (SocketAddr, FakeApi, JoinHandle<()>) {
        let (service, fake, answers) = FakeApi::answering();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local address");
        let task = tokio::spawn(async move {
            // The connections end with the listener (a killed server's do).
            let mut connections = JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let service = service.clone();
                connections.spawn(async move {
                    let answer = hyper::service::service_fn(move |request: Request<Incoming>| {
                        let service = service.clone();
                        // A failed request (a refusal) closes the connection.
                        async move {
                            let (parts, body) = request.into_parts();
                            let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
                            let request = Request::from_parts(parts, kube::client::Body::from(body));
                            service.oneshot(request).await.map_err(|e| e.to_string())
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), answer)
                        .await;
                });
                // Reap the finished ones as we go.
                while connections.try_join_next().is_some() {}
            }
            answers.abort();
        });
        (addr, fake, task)
    }

    /// A new fake and the service its answering task takes requests from.
    fn answering() -> (MockService, FakeApi, JoinHandle<()>) {
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
                let (parts, body) = request.into_parts();
                let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                server.handle(&parts, &body, send);
            }
        });
        (service, fake, task)
    }

    fn handle(
        &self,
        request: &http::request::Parts,
        body: &[u8],
        send: tower_test::mock::SendResponse<Response<MockBody>>,
    ) {
        let seen = Seen {
            method: request.method.to_string(),
            path: request.uri.path().to_owned(),
            query: request.uri.query().unwrap_or("").to_owned(),
            body: String::from_utf8_lossy(body).into_owned(),
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

    /// Sets how GETs of one object of a resource in a namespace are answered.
    pub fn set_object_get(&self, resource: &str, ns: &str, reply: Reply) {
        lock(&self.state)
            .object_gets
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

    /// Sets how Event writes (`events.k8s.io/v1` creates and patches) are answered.
    pub fn set_event_writes(&self, reply: Reply) {
        lock(&self.state).event_writes = Some(reply);
    }

    /// Answers the next Event writes with these, in order, then as
    /// [`FakeApi::set_event_writes`] says (a failure that passes, without a race).
    pub fn script_event_writes(&self, replies: impl IntoIterator<Item = Reply>) {
        lock(&self.state).event_writes_script.extend(replies);
    }

    /// The Event writes so far: (method, body).
    pub fn event_writes(&self) -> Vec<(String, Value)> {
        lock(&self.state)
            .log
            .iter()
            .filter(|s| is_event_write(s))
            .map(|s| (s.method.clone(), s.json()))
            .collect()
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

    /// Ends every open watch stream, as a restarting server or a proxy's timeout does:
    /// the clients watch again (or list again).
    pub fn close_watches(&self) {
        lock(&self.state).streams.clear();
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
    if is_event_write(seen) {
        let reply = (st.event_writes_script.pop_front())
            .or_else(|| st.event_writes.clone())
            .unwrap_or(Reply::Normal);
        let code = if seen.method == "POST" { 201 } else { 200 };
        let echo = || respond_json(code, &seen.json());
        return answer_with(reply, echo, "events is forbidden");
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
    if let ["api", "v1", "namespaces", ns, resource, name] = segments.as_slice()
        && seen.method == "GET"
        && !st.gets.contains_key(&seen.path)
    {
        let key = ((*resource).to_owned(), (*ns).to_owned());
        let reply = st.object_gets.get(&key).cloned().unwrap_or(Reply::Normal);
        let found = (st.objects.get(&key).into_iter().flatten())
            .find(|o| o["metadata"]["name"] == *name)
            .cloned();
        let object = || match found {
            Some(object) => respond_json(200, &object),
            None => respond_json(
                404,
                &status_body(404, &format!("{resource} \"{name}\" not found")),
            ),
        };
        return answer_with(
            reply,
            object,
            &format!("{resource} \"{name}\" is forbidden: User \"agent\" cannot get"),
        );
    }
    match st.gets.get(&seen.path) {
        Some((0, _)) => Answer::Park,
        Some((code, body)) => Answer::Respond(respond_json(*code, body)),
        None => Answer::Respond(respond_json(404, &status_body(404, "not found"))),
    }
}

/// A create (`POST …/events`) or patch (`PATCH …/events/<name>`) of an `events.k8s.io/v1`
/// Event.
fn is_event_write(seen: &Seen) -> bool {
    let segments: Vec<&str> = seen.path.trim_start_matches('/').split('/').collect();
    match segments.as_slice() {
        ["apis", "events.k8s.io", "v1", "namespaces", _, "events"] => seen.method == "POST",
        ["apis", "events.k8s.io", "v1", "namespaces", _, "events", _] => seen.method == "PATCH",
        _ => false,
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
