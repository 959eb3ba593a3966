//! The whole agent in-process (`ckpt_bin::run_agent`, the same code as `pod-checkpointer
//! run`) against `ckpt_testkit`'s fake API server (kube's `tower-test` pattern), a
//! fake CRI runtime and a fake kubelet, on temp dirs. Two copies of the agent — the
//! DaemonSet copy and the static copy — share one lock file as on a node.
//!
//! Every step asserts the files on disk (inactive checkpoints, the kubelet's manifests
//! dir, Secret/ConfigMap data, the state journal). Nothing asserts a duration: steps wait
//! for conditions with generous timeouts (yet shorter than the agent's 30 s resync, so
//! every reaction must follow from an event), and "nothing happened" is checked after the
//! agent has provably looked (two runtime polls, or a pass in a given API state).
//!
//! The tests run on current-thread runtimes, so each test's agents log into its own
//! capture (printed when the test fails); the order of removals is read from it.

#[path = "support/http.rs"]
mod http;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ckpt_bin::ApiSource;
use ckpt_bin::config::Cli;
use ckpt_testkit::{FakeApi, FakeCri, FakeKubelet, FaultProxy, NetFault, Reply};
use ckpt_watch::cri::proto;
use clap::Parser;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::Instrument;

const NS: &str = "kube-system";
const NODE: &str = "node-1";
/// The agent's own DaemonSet pod.
const AGENT: &str = "pod-checkpointer-xyz";
/// The static copy, as the kubelet names the agent's self checkpoint.
const AGENT_STATIC: &str = "pod-checkpointer-xyz-node-1";
/// A parent with a Secret and a ConfigMap.
const APISERVER: &str = "kube-apiserver-abc";
/// A parent without data whose name sorts after the agent's (self-GC must still remove
/// the agent last).
const NETWORK: &str = "pod-network-abc";
/// Not annotated: never checkpointed.
const SCHEDULER: &str = "kube-scheduler-abc";
/// Annotated, but mounts a PersistentVolumeClaim: refused, never checkpointed.
const BACKUP: &str = "etcd-backup-abc";
/// How long a step may take: generous (the machine is shared; steps take well under a
/// second), yet below the agent's 30 s resync, so a reaction that only the resync would
/// bring about fails the test — every reaction must follow from an event.
const WAIT: u64 = 20;

// ---------------------------------------------------------------------------------------
// The world: a node's directories, the fake API server, CRI runtime and kubelet
// ---------------------------------------------------------------------------------------

fn owner(daemonset: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "name": daemonset,
           "uid": format!("uid-ds-{daemonset}"), "controller": true, "blockOwnerDeletion": true})
}

/// A parent pod as the API server lists it: annotated, owned by a DaemonSet, on this node.
fn parent(name: &str, daemonset: &str, image: &str, volumes: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}"), "resourceVersion": "1",
                     "annotations": {"checkpointer.alpha.coreos.com/checkpoint": "true"},
                     "labels": {"app": daemonset},
                     "ownerReferences": [owner(daemonset)]},
        "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": image}], "volumes": volumes},
        "status": {"phase": "Running"}})
}

fn apiserver_pod() -> Value {
    let mut pod = parent(
        APISERVER,
        "kube-apiserver",
        "kube-apiserver:v1.20.2",
        json!([{"name": "certs", "secret": {"secretName": "apiserver-certs"}},
               {"name": "config", "configMap": {"name": "apiserver-config"}}]),
    );
    pod["spec"]["containers"][0]["volumeMounts"] = json!([
        {"name": "certs", "mountPath": "/etc/certs"}, {"name": "config", "mountPath": "/etc/config"}]);
    // Its data belongs to the user it runs as: root, unless the tests run as another user,
    // who cannot give files to root.
    if !running_as_root() {
        let (uid, gid) = (
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
        );
        pod["spec"]["securityContext"] = json!({"runAsUser": uid, "fsGroup": gid});
    }
    pod
}

fn agent_pod(name: &str, image: &str) -> Value {
    parent(name, "pod-checkpointer", image, json!([]))
}

fn network_pod() -> Value {
    parent(NETWORK, "pod-network", "flannel:v0.13", json!([]))
}

fn scheduler_pod() -> Value {
    let mut pod = parent(SCHEDULER, "kube-scheduler", "kube-scheduler:v1.20.2", json!([]));
    pod["metadata"]["annotations"] = json!({});
    pod
}

fn backup_pod() -> Value {
    parent(
        BACKUP,
        "etcd-backup",
        "etcd-backup:v1",
        json!([{"name": "data", "persistentVolumeClaim": {"claimName": "backups"}}]),
    )
}

fn apiserver_secret(key: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "apiserver-certs", "namespace": NS, "resourceVersion": "1"},
        "data": {"tls.key": key}})
}

/// The pod as the kubelet's `/pods` shows it, running (for the CRI-off mode).
fn kubelet_view(pod: &Value) -> Value {
    let mut pod = pod.clone();
    pod["status"] = json!({"phase": "Running", "containerStatuses": [{"name": "main", "ready": true,
        "restartCount": 0, "image": "i", "imageID": "", "state": {"running": {}}}]});
    pod
}

/// Lines of captured logs (JSON, one event per line), shown when a test fails.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn events(&self) -> Vec<Value> {
        let bytes = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        String::from_utf8_lossy(&bytes)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The pods of the "checkpoint removed" events of one copy of the agent, in order.
    fn removed_by(&self, copy: &str) -> Vec<String> {
        self.events()
            .iter()
            .filter(|e| e["message"] == "checkpoint removed" && e["span"]["copy"] == copy)
            .filter_map(|e| e["pod"].as_str().map(str::to_owned))
            .collect()
    }
}

/// Where the local view comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Local {
    /// `--runtime-endpoint` the fake CRI (the kubelet is not polled).
    Cri,
    /// `--runtime-endpoint ""`: the kubelet's `/pods` decides.
    Kubelet,
}

struct World {
    root: tempfile::TempDir,
    api: FakeApi,
    client: kube::Client,
    cri: FakeCri,
    kubelet: FakeKubelet,
    local: Local,
    /// Between the agent and the fake API server, in the worlds made by
    /// [`World::behind_proxy`].
    proxy: Option<FaultProxy>,
    logs: Logs,
    _log_guard: tracing::subscriber::DefaultGuard,
}

/// How the API server is down in a scenario.
#[derive(Clone, Debug)]
enum Down {
    /// The fake answers so (refuses connections, hangs).
    Api(Reply),
    /// The network between the agent and the fake does so (the fake over TCP, behind a
    /// [`FaultProxy`]).
    Net(NetFault),
}

impl Drop for World {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let bytes = self.logs.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
            eprintln!("---- agent logs ----\n{}", String::from_utf8_lossy(&bytes));
            eprintln!("---- files ----\n{:#?}", self.files());
        }
    }
}

impl World {
    /// A node with the API up, serving the parents (and the scheduler, not a parent), and
    /// every given pod running locally. Logs of this test's thread are captured (the
    /// tests run on a current-thread runtime, so the agents' tasks log here too).
    async fn new(local: Local, running: &[&str]) -> World {
        let (client, api, _task) = FakeApi::start();
        World::with_api(local, running, client, api, None).await
    }

    /// The same world with the fake API server on a real socket and a [`FaultProxy`]
    /// between it and the agent.
    async fn behind_proxy(local: Local, running: &[&str]) -> World {
        let (addr, api, _task) = FakeApi::serve().await;
        let proxy = FaultProxy::start(addr).await;
        let url = proxy.url().parse().expect("the proxy's URL");
        let client = kube::Client::try_from(kube::Config::new(url)).expect("a client of the proxy");
        World::with_api(local, running, client, api, Some(proxy)).await
    }

    /// The same world with the fake API server on a real socket, for a copy that makes
    /// its own client from a kubeconfig; the server's URL with it.
    async fn served(local: Local, running: &[&str]) -> (World, String) {
        let (addr, api, _task) = FakeApi::serve().await;
        let url = format!("http://{addr}");
        let config = kube::Config::new(url.parse().expect("the fake's URL"));
        let client = kube::Client::try_from(config).expect("a client of the fake");
        (World::with_api(local, running, client, api, None).await, url)
    }

    /// The world for a world constructor's API server.
    async fn with_api(
        local: Local,
        running: &[&str],
        client: kube::Client,
        api: FakeApi,
        proxy: Option<FaultProxy>,
    ) -> World {
        let logs = Logs::default();
        let writer = logs.clone();
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube_client::client::builder=off"));
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .json()
            .flatten_event(true)
            .with_writer(move || writer.clone())
            .finish();
        let log_guard = tracing::subscriber::set_default(subscriber);

        let root = tempfile::tempdir().expect("temp dir");
        for dir in ["ck", "manifests", "run"] {
            std::fs::create_dir(root.path().join(dir)).expect("dir");
        }
        // The kubelet's own static pod: never ours to touch.
        std::fs::write(root.path().join("manifests/etcd.yaml"), "kind: Pod\n").expect("etcd manifest");

        api.set_objects(
            "pods",
            NS,
            vec![
                apiserver_pod(),
                agent_pod(AGENT, "pod-checkpointer:v1"),
                network_pod(),
                scheduler_pod(),
                backup_pod(),
            ],
        );
        // base64 of "secret-key"
        api.set_objects("secrets", NS, vec![apiserver_secret("c2VjcmV0LWtleQ==")]);
        api.set_objects(
            "configmaps",
            NS,
            vec![json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "apiserver-config", "namespace": NS, "resourceVersion": "1"},
                "data": {"config.yaml": "port: 6443\n"}})],
        );
        for ds in [
            "kube-apiserver",
            "pod-checkpointer",
            "pod-network",
            "kube-scheduler",
        ] {
            api.set_get(
                &format!("/apis/apps/v1/namespaces/{NS}/daemonsets/{ds}"),
                200,
                json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
                       "metadata": {"name": ds, "namespace": NS, "uid": format!("uid-ds-{ds}")}}),
            );
        }
        let world = World {
            root,
            api,
            client,
            cri: FakeCri::start(true, false),
            kubelet: FakeKubelet::start(false).await,
            local,
            proxy,
            logs,
            _log_guard: log_guard,
        };
        for pod in running {
            world.run(pod);
        }
        world
    }

    /// The proxy of a world made by [`World::behind_proxy`].
    fn proxy(&self) -> &FaultProxy {
        self.proxy.as_ref().expect("a world behind a proxy")
    }

    /// The API server goes down as `down` says.
    fn go_down(&self, down: &Down) {
        match down {
            Down::Api(reply) => self.api.set_outage(reply.clone()),
            Down::Net(fault) => self.proxy().set(*fault),
        }
    }

    /// The API server is back.
    fn come_back(&self, down: &Down) {
        match down {
            Down::Api(_) => self.api.end_outage(),
            Down::Net(_) => self.proxy().set(NetFault::Pass),
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.path().join(rel)
    }

    /// The pod runs on the node: in the CRI and, for the parents the API lists from the
    /// start, in the kubelet's `/pods` (the CRI-off tests run only those).
    fn run(&self, name: &str) {
        self.cri
            .add_pod(NS, name, proto::SANDBOX_READY, &[proto::CONTAINER_RUNNING]);
        let pod = match name {
            APISERVER => apiserver_pod(),
            AGENT => agent_pod(AGENT, "pod-checkpointer:v1"),
            NETWORK => network_pod(),
            SCHEDULER => scheduler_pod(),
            BACKUP => backup_pod(),
            _ => return,
        };
        self.kubelet
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pods
            .push(kubelet_view(&pod));
    }

    /// The pod no longer runs on the node.
    fn kill(&self, name: &str) {
        self.cri.remove_pod(NS, name);
        self.kubelet
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pods
            .retain(|p| p["metadata"]["name"] != name);
    }

    /// Every file under the checkpoint dir and the manifests dir, relative to the root.
    fn files(&self) -> Vec<String> {
        fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                // A volume's versions and its `..data` link: the pod sees the keys.
                if entry.file_name().as_encoded_bytes().starts_with(b"..") {
                    continue;
                }
                if path.is_dir() {
                    walk(&path, root, out);
                } else {
                    out.push(path.strip_prefix(root).expect("under root").display().to_string());
                }
            }
        }
        let mut out = Vec::new();
        for dir in ["ck", "manifests"] {
            walk(&self.path(dir), self.root.path(), &mut out);
        }
        out.sort();
        out
    }

    /// Waits until the files are exactly `expected`.
    async fn expect_files(&self, what: &str, expected: &[String]) {
        self.expect_files_within(WAIT, what, expected).await;
    }

    /// Waits up to `secs` until the files are exactly `expected`.
    async fn expect_files_within(&self, secs: u64, what: &str, expected: &[String]) {
        let mut expected = expected.to_vec();
        expected.sort();
        expected.dedup();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let files = self.files();
            if files == expected {
                return;
            }
            if tokio::time::Instant::now() > deadline {
                panic!("{what}: the files on disk are\n{files:#?}\nexpected\n{expected:#?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The files are exactly `expected`, now.
    fn assert_files(&self, what: &str, expected: &[String]) {
        let mut expected = expected.to_vec();
        expected.sort();
        expected.dedup();
        assert_eq!(self.files(), expected, "{what}");
    }

    fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
    }

    /// Local observations so far (each pass is preceded by one).
    fn local_polls(&self) -> usize {
        match self.local {
            Local::Cri => self
                .cri
                .state
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .calls
                .iter()
                .filter(|c| c.ends_with("/ListContainers"))
                .count(),
            Local::Kubelet => self.kubelet.requests(),
        }
    }

    /// Returns once the active agent has observed the node twice more: the loop observes
    /// and passes in turn, so whatever the first observation showed has been acted on.
    /// Writes the state journal (the agent stopped), as the agent keeps it.
    fn write_journal(&self, state: Value) {
        use std::os::unix::fs::PermissionsExt as _;
        let journal = json!({"version": 1, "state": state});
        let path = self.path(JOURNAL);
        let agent_dir = path.parent().expect("the agent's dir");
        std::fs::create_dir_all(agent_dir).expect("the agent's dir");
        std::fs::set_permissions(agent_dir, std::fs::Permissions::from_mode(0o700)).expect("0700");
        std::fs::write(&path, journal.to_string()).expect("journal written");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("0600");
    }

    async fn looked_twice(&self, what: &str) {
        let start = self.local_polls();
        eventually(what, || async { self.local_polls() >= start + 2 }).await;
    }

    /// Starts a copy of the agent with this pod name and extra flags.
    fn start_agent(&self, pod_name: &str, extra: &[&str]) -> Agent {
        self.start_agent_from(pod_name, extra, ApiSource::Client(self.client.clone()))
    }

    /// Starts a copy of the agent with its API client from `source`.
    fn start_agent_from(&self, pod_name: &str, extra: &[&str], source: ApiSource) -> Agent {
        let port = free_port();
        let dir = |d: &str| self.path(d).display().to_string();
        let endpoint = match self.local {
            Local::Cri => self.cri.endpoint(),
            Local::Kubelet => String::new(),
        };
        let mut args: Vec<String> = [
            "pod-checkpointer",
            "run",
            "--node-name",
            NODE,
            "--pod-name",
            pod_name,
            "--pod-namespace",
            NS,
            "--kubelet-url",
            &self.kubelet.url,
            "--runtime-endpoint",
            &endpoint,
            "--checkpoint-dir",
            &dir("ck"),
            "--manifests-dir",
            &dir("manifests"),
            "--lock-file",
            &dir("run/pod-checkpointer.lock"),
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let cli = Cli::try_parse_from(args).expect("a valid command line");
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async move {
            // A dropped Agent stops too.
            let _ = stopped.await;
        };
        let span = tracing::info_span!("agent", copy = pod_name);
        let task = tokio::spawn(ckpt_bin::run_agent(cli, source, shutdown).instrument(span));
        Agent {
            port,
            stop: Some(stop),
            task,
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Waits (polling) until `cond` holds; fails the test after [`WAIT`] seconds.
async fn eventually<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(WAIT);
    while !cond().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------
// A running copy of the agent
// ---------------------------------------------------------------------------------------

struct Agent {
    port: u16,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<ckpt_bin::Result<()>>,
}

impl Agent {
    /// `(status, body)` of a GET on the health port; `None` if nothing answers yet.
    async fn get(&self, path: &str) -> Option<(u16, String)> {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .ok()?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = String::new();
        tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut response))
            .await
            .ok()?
            .ok()?;
        let status = response.split_whitespace().nth(1)?.parse().ok()?;
        let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
        Some((status, body))
    }

    /// The samples of `/metrics`, by name with labels.
    async fn metrics(&self) -> BTreeMap<String, f64> {
        let Some((200, body)) = self.get("/metrics").await else {
            return BTreeMap::new();
        };
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (name, value) = l.rsplit_once(' ')?;
                Some((name.to_owned(), value.parse().ok()?))
            })
            .collect()
    }

    /// One sample (`pod_checkpointer_` is added); 0 when absent.
    async fn metric(&self, name: &str) -> f64 {
        self.metrics()
            .await
            .get(&format!("pod_checkpointer_{name}"))
            .copied()
            .unwrap_or(0.0)
    }

    /// Waits for a counter to reach `expected`, then requires exactly that: counters are
    /// bumped after the files change, so a read right after the files may see one lag.
    async fn expect_count(&self, name: &str, expected: f64) {
        eventually(&format!("{name} to reach {expected}"), || async {
            self.metric(name).await >= expected
        })
        .await;
        assert_eq!(self.metric(name).await, expected, "{name}");
    }

    /// The sum of a metric's samples over all labels (0 when none).
    async fn metric_sum(&self, name: &str) -> f64 {
        let prefix = format!("pod_checkpointer_{name}");
        self.metrics()
            .await
            .iter()
            .filter(|(k, _)| *k == &prefix || k.starts_with(&format!("{prefix}{{")))
            .map(|(_, v)| v)
            .sum()
    }

    async fn readyz(&self) -> Option<(u16, String)> {
        self.get("/readyz").await
    }

    /// Waits until `/readyz` answers `status` with `body`.
    async fn expect_ready(&self, what: &str, status: u16, body: &str) {
        eventually(what, || async {
            self.readyz()
                .await
                .is_some_and(|(s, b)| s == status && b.trim() == body)
        })
        .await;
    }

    /// Waits until a pass has completed with the API in `state` (the gauge is set at the
    /// end of every pass).
    async fn expect_api(&self, state: &str) {
        eventually(&format!("a pass with the API {state}"), || async {
            self.metric(&format!("api_state{{state=\"{state}\"}}")).await == 1.0
        })
        .await;
    }

    /// Stops it as SIGTERM does; its result.
    async fn stop(mut self) -> ckpt_bin::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(WAIT), &mut self.task)
            .await
            .expect("the agent stops on the shutdown signal")
            .expect("the agent task does not panic")
    }

    /// Waits until it exits by itself; its result.
    async fn exited(mut self) -> ckpt_bin::Result<()> {
        tokio::time::timeout(Duration::from_secs(WAIT), &mut self.task)
            .await
            .expect("the agent exits by itself")
            .expect("the agent task does not panic")
    }

    fn is_running(&self) -> bool {
        !self.task.is_finished()
    }
}

// ---------------------------------------------------------------------------------------
// File names
// ---------------------------------------------------------------------------------------

fn inactive(pod: &str) -> String {
    format!("ck/inactive-manifests/{NS}_{pod}.json")
}

fn active(pod: &str) -> String {
    format!("manifests/{NS}_{pod}.json")
}

const ETCD: &str = "manifests/etcd.yaml";
const JOURNAL: &str = "ck/pod-checkpointer/state.json";

fn apiserver_data() -> Vec<String> {
    vec![
        format!("ck/checkpoint-secrets/{NS}/{APISERVER}/apiserver-certs/tls.key"),
        format!("ck/checkpoint-configmaps/{NS}/{APISERVER}/apiserver-config/config.yaml"),
    ]
}

/// Every parent checkpointed, the agent's own checkpoint active (seed scenario A).
/// The files of a node whose parents are checkpointed, the journal included: it records
/// each parent's content as first seen (how a later change is proven, issue 36).
fn checkpointed(self_pod: &str) -> Vec<String> {
    let mut files = vec![
        inactive(APISERVER),
        inactive(self_pod),
        inactive(NETWORK),
        active(self_pod),
        ETCD.to_owned(),
        JOURNAL.to_owned(),
    ];
    files.extend(apiserver_data());
    files
}

/// `files` and `more`, each file once.
fn with(mut files: Vec<String>, more: &[String]) -> Vec<String> {
    files.extend(more.iter().cloned());
    files.sort();
    files.dedup();
    files
}

/// Waits until the state journal says exactly `expected` are absent. A wait, not a
/// check: the journal is written at the end of the pass whose file changes a step saw
/// (the executor yields between actions, so a test can look in between).
async fn expect_journal_absent(world: &World, what: &str, expected: &[String]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(WAIT);
    loop {
        let absent = journal_absent(world);
        if absent == expected {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: the journal says absent {absent:?}, expected {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The pods the state journal says are absent.
fn journal_absent(world: &World) -> Vec<String> {
    let journal: Value = serde_json::from_str(&world.read(JOURNAL)).expect("journal is JSON");
    let mut names: Vec<String> = journal
        .pointer("/state/absent_since")
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("no absent_since in {journal}"))
        .iter()
        .map(|e| {
            format!(
                "{}/{}",
                e["namespace"].as_str().unwrap_or(""),
                e["name"].as_str().unwrap_or("")
            )
        })
        .collect();
    names.sort();
    names
}

// ---------------------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------------------

/// Seed scenarios A → B → C as one node's story: checkpoint; reboot without an API
/// server (`down`: nothing listens, or the address answers nothing); API back,
/// descheduling, self-GC.
async fn seed_scenarios(down: Down) {
    let running = [APISERVER, AGENT, NETWORK, SCHEDULER];
    let world = match down {
        Down::Api(_) => World::new(Local::Cri, &running).await,
        Down::Net(_) => World::behind_proxy(Local::Cri, &running).await,
    };
    let gc = ["--gc-strategy", "grace-period", "--checkpoint-grace-period", "2s"];

    // A: the DaemonSet copy, API up: checkpoints the parents and itself, activates itself.
    let daemonset = world.start_agent(AGENT, &gc);
    world.expect_files("A: checkpointed", &checkpointed(AGENT)).await;
    daemonset
        .expect_ready("A: the DaemonSet copy ready", 200, "ok")
        .await;
    assert_eq!(
        world.read(&active(AGENT)),
        world.read(&inactive(AGENT)),
        "A: self active = inactive"
    );
    assert_eq!(
        world.read(&format!(
            "ck/checkpoint-secrets/{NS}/{APISERVER}/apiserver-certs/tls.key"
        )),
        "secret-key"
    );
    assert_eq!(
        world.read(&format!(
            "ck/checkpoint-configmaps/{NS}/{APISERVER}/apiserver-config/config.yaml"
        )),
        "port: 6443\n"
    );
    assert_eq!(world.read(ETCD), "kind: Pod\n");
    world.looked_twice("A: settled").await;
    world.assert_files("A: nothing else happens", &checkpointed(AGENT));
    assert_eq!(
        daemonset.metric("activations_total").await,
        1.0,
        "A: only self activated"
    );
    assert_eq!(
        daemonset.metric("refused_total").await,
        1.0,
        "A: the PVC pod is refused"
    );
    // A rotated Secret is followed (watched, not polled); nothing else is rewritten.
    let self_written = identity_of(&world, &active(AGENT));
    world
        .api
        .apply("secrets", NS, apiserver_secret("cm90YXRlZC1rZXk=")); // "rotated-key"
    let key_file = format!("ck/checkpoint-secrets/{NS}/{APISERVER}/apiserver-certs/tls.key");
    eventually("A: the rotated key on disk", || async {
        std::fs::read_to_string(world.path(&key_file)).is_ok_and(|k| k == "rotated-key")
    })
    .await;
    world.looked_twice("A: after the rotation").await;
    world.assert_files("A: after the rotation", &checkpointed(AGENT));
    assert_eq!(
        identity_of(&world, &active(AGENT)),
        self_written,
        "A: self not rewritten"
    );

    // B: reboot. Nothing runs, no API server (it is one of the checkpoints). The kubelet
    // starts the static copy from the self checkpoint; it takes the lock and starts the
    // other checkpoints.
    daemonset.stop().await.expect("A: SIGTERM exits 0");
    world.assert_files(
        "B: a stopped agent leaves everything in place",
        &checkpointed(AGENT),
    );
    world.cri.clear();
    world.go_down(&down);
    let outage = (Instant::now(), world.proxy.as_ref().map(FaultProxy::accepted));
    let static_copy = world.start_agent(AGENT_STATIC, &gc);
    let booted = with(checkpointed(AGENT), &[active(APISERVER), active(NETWORK)]);
    world.expect_files("B: checkpoints activated", &booted).await;
    static_copy
        .expect_ready("B: the static copy ready", 200, "ok")
        .await;
    assert_eq!(world.read(&active(APISERVER)), world.read(&inactive(APISERVER)));
    // Counted once the pass is done, which may be after its files are seen; self was
    // already active, so two.
    static_copy.expect_count("activations_total", 2.0).await;
    // The kubelet runs the checkpoints as static pods (`<name>-<node>`): not their parents.
    for pod in [APISERVER, NETWORK, AGENT] {
        world.cri.add_pod(
            NS,
            &format!("{pod}-{NODE}"),
            proto::SANDBOX_READY,
            &[proto::CONTAINER_RUNNING],
        );
    }
    world.looked_twice("B: static pods running").await;
    world.assert_files("B: static pods do not count as parents", &booted);
    if let (Some(proxy), (since, Some(accepted))) = (&world.proxy, outage) {
        // No reconnection storm, no connection leak: the probe (at most 4 a second)
        // and the retried lists of the Secret and ConfigMap watches, each closed when
        // it has waited long enough.
        let secs = since.elapsed().as_secs_f64();
        let new = proxy.accepted() - accepted;
        eprintln!(
            "B ({down:?}): {new} connections in {secs:.1} s, {} open",
            proxy.open()
        );
        assert!(
            (new as f64) <= 5.0 * secs + 10.0,
            "B: {new} connections in {secs:.1} s"
        );
        assert!(proxy.open() <= 8, "B: {} connections open", proxy.open());
    }

    // C: the API server is back (served by its checkpoint). Its parents do not run yet:
    // the checkpoints stay active (bootkube's duplicate-apiserver bug).
    world.come_back(&down);
    static_copy.expect_api("synced").await;
    world.looked_twice("C: API back").await;
    world.assert_files("C: API back, parents not running: still active", &booted);
    // The Secret's watch works again too (it was not stopped by the outage).
    world
        .api
        .apply("secrets", NS, apiserver_secret("c2Vjb25kLWtleQ==")); // "second-key"
    eventually("C: a Secret rotated after the outage on disk", || async {
        std::fs::read_to_string(world.path(&key_file)).is_ok_and(|k| k == "second-key")
    })
    .await;
    assert_eq!(static_copy.metric("deactivations_total").await, 0.0);
    // The parents start: their checkpoints step aside.
    world.run(APISERVER);
    world.run(NETWORK);
    world
        .expect_files("C: parents run again", &checkpointed(AGENT))
        .await;
    world.kill(&format!("{APISERVER}-{NODE}"));
    world.kill(&format!("{NETWORK}-{NODE}"));
    static_copy.expect_count("deactivations_total", 2.0).await;
    // The DaemonSet copy starts again and waits for the lock.
    world.run(AGENT);
    let daemonset = world.start_agent(AGENT, &gc);
    daemonset
        .expect_ready("C: the DaemonSet copy on standby", 200, "standby")
        .await;
    assert_eq!(daemonset.metric("lock_held").await, 0.0);
    world.looked_twice("C: standby").await;
    world.assert_files("C: standby changes nothing", &checkpointed(AGENT));

    // Descheduling: the agent's DaemonSet no longer targets this node (its nodeSelector)
    // and the parents are deleted; absent since now (journal), removed after the grace
    // period; every other checkpoint first, then the agent's own, then it exits 0. The
    // DaemonSet used to stay as it was (no pod template, this node's Node not found: an
    // unknown scheduling) and the strategy decided self-GC; issue 36's rule keeps
    // everything then, so the descheduling is read for what it is.
    world.api.set_get(
        &format!("/apis/apps/v1/namespaces/{NS}/daemonsets/pod-checkpointer"),
        200,
        json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
               "metadata": {"name": "pod-checkpointer", "namespace": NS, "uid": "uid-ds-pod-checkpointer"},
               "spec": {"selector": {}, "template": {"spec": {
                   "nodeSelector": {"e2e.pod-checkpointer/elsewhere": "true"},
                   "containers": [{"name": "agent", "image": "pod-checkpointer:v1"}]}}}}),
    );
    world.api.set_get(
        &format!("/api/v1/nodes/{NODE}"),
        200,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}),
    );
    for pod in [APISERVER, NETWORK, AGENT] {
        assert!(world.api.delete("pods", NS, pod), "{pod} was listed");
        world.kill(pod);
    }
    world
        .expect_files(
            "C: deleted parents are remembered",
            &with(checkpointed(AGENT), &[JOURNAL.to_owned()]),
        )
        .await;
    expect_journal_absent(
        &world,
        "C: deleted parents are remembered",
        &[APISERVER, AGENT, NETWORK].map(|p| format!("{NS}/{p}")),
    )
    .await;
    static_copy.exited().await.expect("C: exit 0 after self-GC");
    // Everything of ours, the state journal too: only the other static pod is left.
    world
        .expect_files("C: self-GC removed everything", &[ETCD.to_owned()])
        .await;
    assert_eq!(
        world.logs.removed_by(AGENT_STATIC),
        [APISERVER, NETWORK, AGENT].map(|p| format!("{NS}/{p}")),
        "C: sorted, self last"
    );
    // The DaemonSet copy takes the lock; nothing is listed any more, nothing comes back.
    daemonset
        .expect_ready("C: the DaemonSet copy takes over", 200, "ok")
        .await;
    world.looked_twice("C: after self-GC").await;
    world.assert_files("C: no resurrection", &[ETCD.to_owned()]);
    daemonset.stop().await.expect("SIGTERM exits 0");
}

#[tokio::test]
async fn seed_scenarios_with_the_api_server_refusing_connections() {
    seed_scenarios(Down::Api(Reply::Refuse)).await;
}

#[tokio::test]
async fn seed_scenarios_with_the_api_server_answering_503() {
    seed_scenarios(Down::Api(Reply::Status(503))).await;
}

#[tokio::test]
async fn seed_scenarios_with_the_network_to_the_api_server_blackholed() {
    seed_scenarios(Down::Net(NetFault::Blackhole)).await;
}

#[tokio::test]
async fn seed_scenarios_with_every_connection_to_the_api_server_reset() {
    seed_scenarios(Down::Net(NetFault::Reset)).await;
}

#[tokio::test]
async fn seed_scenarios_with_the_api_server_hung() {
    seed_scenarios(Down::Api(Reply::Hang)).await;
}

/// Which copy of the agent sees a rolling update of its DaemonSet through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rollout {
    /// The old pod's copy stops when the pod is deleted (the usual order): the static
    /// copy takes over and sees the new pod.
    StaticCopy,
    /// The old pod's copy sees its pod deleted and the new one created before it stops.
    OldCopy,
}

/// A rolling update of the agent's own DaemonSet: the old pod is deleted, then a new
/// pod with a new name and a new image appears. The self checkpoint follows the new
/// pod; no self-GC; the copy that sees it through keeps running.
async fn rolling_update_of_the_agent(strategy: &str, rollout: Rollout) {
    const NEW: &str = "pod-checkpointer-new";
    let world = World::new(Local::Cri, &[APISERVER, AGENT, NETWORK]).await;
    // Longer than the rollout: the old pod's absence must not count yet.
    let gc = ["--gc-strategy", strategy, "--checkpoint-grace-period", "5m"];
    let daemonset = world.start_agent(AGENT, &gc);
    world.expect_files("checkpointed", &checkpointed(AGENT)).await;
    daemonset
        .expect_ready("the DaemonSet copy ready", 200, "ok")
        .await;
    world.run(AGENT_STATIC);
    let static_copy = world.start_agent(AGENT_STATIC, &gc);
    static_copy
        .expect_ready("the static copy on standby", 200, "standby")
        .await;

    // The old pod is deleted. The active copy keeps the old self checkpoint while no new
    // pod is there (the journal remembers the absence).
    assert!(world.api.delete("pods", NS, AGENT));
    world.kill(AGENT);
    let (active_copy, active_name, old_copy) = match rollout {
        Rollout::StaticCopy => {
            daemonset.stop().await.expect("SIGTERM exits 0");
            static_copy
                .expect_ready("the static copy takes over", 200, "ok")
                .await;
            (static_copy, AGENT_STATIC, None)
        }
        Rollout::OldCopy => (daemonset, AGENT, Some(static_copy)),
    };
    let between = with(checkpointed(AGENT), &[JOURNAL.to_owned()]);
    world.expect_files("old pod gone, no new one yet", &between).await;
    active_copy.expect_api("synced").await;
    world.looked_twice("between the pods").await;
    world.assert_files("old pod gone, no new one yet: kept", &between);
    expect_journal_absent(&world, "old pod gone", &[format!("{NS}/{AGENT}")]).await;
    assert!(active_copy.is_running(), "no self-GC during a rollout");

    // The new pod: same DaemonSet, new name, new image.
    world.api.apply("pods", NS, agent_pod(NEW, "pod-checkpointer:v2"));
    world.run(NEW);
    let rolled = with(checkpointed(NEW), &[JOURNAL.to_owned()]);
    world
        .expect_files("the self checkpoint follows the new pod", &rolled)
        .await;
    assert_eq!(world.read(&active(NEW)), world.read(&inactive(NEW)));
    assert!(
        world.read(&active(NEW)).contains("pod-checkpointer:v2"),
        "the new spec"
    );
    expect_journal_absent(&world, "the self checkpoint follows the new pod", &[]).await;
    assert_eq!(world.logs.removed_by(active_name), [format!("{NS}/{AGENT}")]);
    world.looked_twice("after the rollout").await;
    world.assert_files("after the rollout: stable", &rolled);
    assert!(active_copy.is_running(), "no self-GC after a rollout");

    // The old copies go (the kubelet stops what it no longer has a manifest or pod for);
    // the new DaemonSet copy waits for the lock, then takes over and changes nothing.
    let new_daemonset = world.start_agent(NEW, &gc);
    new_daemonset
        .expect_ready("the new DaemonSet copy on standby", 200, "standby")
        .await;
    world.assert_files("standby changes nothing", &rolled);
    if let Some(old) = old_copy {
        old.stop().await.expect("SIGTERM exits 0");
    }
    active_copy.stop().await.expect("SIGTERM exits 0");
    new_daemonset
        .expect_ready("the new DaemonSet copy takes over", 200, "ok")
        .await;
    world.looked_twice("the new copy active").await;
    world.assert_files("the new copy changes nothing", &rolled);
    new_daemonset.stop().await.expect("SIGTERM exits 0");
}

/// A connection that goes silent without closing (a NAT entry or a load balancer's flow
/// lost) must not leave the agent with a view it takes for current: the watches on such
/// connections hear nothing more, and kube's own idle timeout notices only after five
/// minutes. A probe without an answer followed by one with an answer restarts them.
#[tokio::test]
async fn a_half_open_connection_to_the_api_server_is_noticed() {
    // The kube-apiserver parent does not run here, so its checkpoint is at stake and the
    // probe runs at its fast pace.
    let world = World::behind_proxy(Local::Cri, &[AGENT, NETWORK, SCHEDULER]).await;
    let agent = world.start_agent(AGENT, &[]);
    world.expect_files("checkpointed", &checkpointed(AGENT)).await;
    agent.expect_api("synced").await;
    let opened = world.proxy().open();

    world.proxy().half_open();
    // What only the silenced watches would bring: a rotated Secret, a parent's new image.
    world
        .api
        .apply("secrets", NS, apiserver_secret("cm90YXRlZC1rZXk=")); // "rotated-key"
    let mut pod = apiserver_pod();
    pod["spec"]["containers"][0]["image"] = json!("kube-apiserver:v1.20.3");
    world.api.apply("pods", NS, pod);
    let key_file = format!("ck/checkpoint-secrets/{NS}/{APISERVER}/apiserver-certs/tls.key");
    eventually("the rotated key on disk", || async {
        std::fs::read_to_string(world.path(&key_file)).is_ok_and(|k| k == "rotated-key")
    })
    .await;
    eventually("the new image in the checkpoint", || async {
        std::fs::read_to_string(world.path(&inactive(APISERVER)))
            .is_ok_and(|m| m.contains("kube-apiserver:v1.20.3"))
    })
    .await;
    agent.expect_api("synced").await;
    // Waited for, not read at once: the pass that wrote the new image saves the journal
    // next (a temporary file, then a rename), and CI once listed that temporary file.
    world
        .expect_files("nothing else changed", &checkpointed(AGENT))
        .await;
    // The silenced connections are closed, not kept beside their replacements.
    eventually("the silenced connections closed", || async {
        world.proxy().open() <= opened
    })
    .await;
    agent.stop().await.expect("SIGTERM exits 0");
}

/// A slow network (a busy node's pod list at 1 KiB/s takes longer than the 10 s a list
/// may take at first) must not keep the agent from ever seeing its pods: each list that
/// runs out of time gets twice as long the next time.
#[tokio::test]
async fn a_slow_api_server_is_synced_in_the_end() {
    let world = World::behind_proxy(Local::Cri, &[APISERVER, AGENT, NETWORK, SCHEDULER]).await;
    // A busy node: 30 more pods, not checkpointed.
    let mut listed = vec![
        apiserver_pod(),
        agent_pod(AGENT, "pod-checkpointer:v1"),
        network_pod(),
        scheduler_pod(),
        backup_pod(),
    ];
    for i in 0..30 {
        let mut pod = scheduler_pod();
        pod["metadata"]["name"] = json!(format!("workload-{i}"));
        pod["metadata"]["labels"] = json!({"app": "workload", "tier": "batch", "index": i.to_string()});
        listed.push(pod);
    }
    let list_bytes: usize = listed.iter().map(|p| p.to_string().len()).sum();
    world.api.set_objects("pods", NS, listed);
    world.proxy().set(NetFault::Slow(1024));
    eprintln!("the pod list: {list_bytes} bytes");
    assert!(list_bytes > 12 * 1024, "the list must take longer than 10 s");

    let agent = world.start_agent(AGENT, &[]);
    // 10 s for the first try, 20 s for the second, which brings the list in ~18 s.
    world
        .expect_files_within(
            120,
            "the checkpoints, over the slow network",
            &checkpointed(AGENT),
        )
        .await;
    agent.expect_api("synced").await;
    assert_eq!(
        agent.metric("activations_total").await,
        1.0,
        "only self activated: a slow server is not an outage"
    );
    agent.stop().await.expect("SIGTERM exits 0");
}

/// A reachable API server answering every list and watch with an error (403 after an
/// RBAC change, 429 when overloaded, 5xx) while `/readyz` answers: the watches retry with
/// a backoff (no request storm), nothing is removed or activated on such a view, and a
/// change made after the storm is followed.
async fn error_storm_from_a_reachable_api_server(code: u16) {
    let world = World::new(Local::Cri, &[APISERVER, AGENT, NETWORK, SCHEDULER]).await;
    let agent = world.start_agent(
        AGENT,
        &["--gc-strategy", "grace-period", "--checkpoint-grace-period", "1s"],
    );
    world.expect_files("checkpointed", &checkpointed(AGENT)).await;
    agent.expect_api("synced").await;

    let watched = ["pods", "secrets", "configmaps"];
    for resource in watched {
        world.api.set_list(resource, NS, Reply::Status(code));
        world.api.set_watch(resource, NS, Reply::Status(code));
    }
    let before = world.api.count(|s| s.method == "GET" && s.path != "/readyz");
    let since = Instant::now();
    world.api.close_watches();
    // The parents are gone in the API's view, but no list says so: nothing is removed.
    for pod in [APISERVER, NETWORK] {
        world.api.delete("pods", NS, pod);
    }
    // Forbidden every pod read, the credentials are as good as rejected (issue 36: the
    // holder hands the lock over if it lasts); any other error leaves it reachable.
    agent
        .expect_api(if code == 403 { "unauthorized" } else { "reachable" })
        .await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    world.assert_files(&format!("{code}: a storm changes nothing"), &checkpointed(AGENT));
    let secs = since.elapsed().as_secs_f64();
    let requests = world.api.count(|s| s.method == "GET" && s.path != "/readyz") - before;
    eprintln!("{code}: {requests} requests in {secs:.1} s");
    // The watches back off from 250 ms doubling to 10 s: about 6 tries each in 8 s;
    // a retry without a backoff would make hundreds.
    assert!(
        requests as f64 <= watched.len() as f64 * (4.0 + secs),
        "{code}: {requests} requests in {secs:.1} s"
    );

    for resource in watched {
        world.api.set_list(resource, NS, Reply::Normal);
        world.api.set_watch(resource, NS, Reply::Normal);
    }
    agent.expect_api("synced").await;
    world.kill(APISERVER);
    world.kill(NETWORK);
    world
        .expect_files(
            &format!("{code}: after the storm, the deleted parents' checkpoints go"),
            &with(
                vec![inactive(AGENT), active(AGENT), ETCD.to_owned()],
                &[JOURNAL.to_owned()],
            ),
        )
        .await;
    agent.stop().await.expect("SIGTERM exits 0");
}

#[tokio::test]
async fn a_403_storm_from_a_reachable_api_server() {
    error_storm_from_a_reachable_api_server(403).await;
}

#[tokio::test]
async fn a_429_storm_from_a_reachable_api_server() {
    error_storm_from_a_reachable_api_server(429).await;
}

#[tokio::test]
async fn a_500_storm_from_a_reachable_api_server() {
    error_storm_from_a_reachable_api_server(500).await;
}

#[tokio::test]
async fn a_503_storm_from_a_reachable_api_server() {
    error_storm_from_a_reachable_api_server(503).await;
}

/// Issue 36's rule (removal on a failed lookup) end to end: the agent's own pod is gone
/// and its DaemonSet cannot be read (503, then 403 as after an RBAC change). Under
/// `immediate` with a 1 s grace period every checkpoint stays, however long that lasts (it
/// used to self-GC a grace period after the pod left); `/metrics` says self-GC is held
/// back, and the warning comes once for the whole streak. A read saying the DaemonSet is
/// deleted then self-GCs, the agent's own checkpoint last.
#[tokio::test]
async fn self_gc_is_held_back_while_the_agents_daemon_set_cannot_be_read() {
    const UNKNOWN: &str = "self_scheduling{state=\"unknown\"}";
    const HELD_BACK: &str = "self-GC is held back";
    let world = World::new(Local::Cri, &[APISERVER, AGENT, NETWORK]).await;
    let daemon_set = format!("/apis/apps/v1/namespaces/{NS}/daemonsets/pod-checkpointer");
    let status = |code: u16| ckpt_testkit::status_body(code, &format!("answered {code}"));
    let gc = ["--gc-strategy", "immediate", "--checkpoint-grace-period", "1s"];
    let agent = world.start_agent(AGENT, &gc);
    world.expect_files("checkpointed", &checkpointed(AGENT)).await;
    agent.expect_ready("ready", 200, "ok").await;
    let warnings = || {
        (world.logs.events().iter())
            .filter(|e| e["message"].as_str().is_some_and(|m| m.contains(HELD_BACK)))
            .count()
    };

    world.api.set_get(&daemon_set, 503, status(503));
    assert!(world.api.delete("pods", NS, AGENT), "listed");
    world.kill(AGENT);
    let kept = with(checkpointed(AGENT), &[JOURNAL.to_owned()]);
    world.expect_files("the agent's pod gone", &kept).await;
    eventually("self-GC held back on /metrics", || async {
        agent.metric(UNKNOWN).await == 1.0
    })
    .await;
    // Past the grace period, passes with the DaemonSet still unreadable (a parent stops
    // and starts again: the runtime poll brings a pass each time), then forbidden.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    for code in [503, 403] {
        world.api.set_get(&daemon_set, code, status(code));
        world.kill(NETWORK);
        world.looked_twice("the parent stopped").await;
        world.run(NETWORK);
        world.looked_twice("the parent runs again").await;
    }
    world.assert_files("a failed read keeps everything", &kept);
    assert!(agent.is_running(), "no self-GC on a failed read");
    assert_eq!(agent.metric(UNKNOWN).await, 1.0);
    assert_eq!(warnings(), 1, "one warning for the streak");

    // A read that succeeds and says deleted: self-GC (no sooner than the grace period
    // after it), then exit 0.
    world.api.set_get(&daemon_set, 404, status(404));
    world.kill(NETWORK);
    agent.exited().await.expect("exit 0 after self-GC");
    world
        .expect_files("self-GC removed everything", &[ETCD.to_owned()])
        .await;
    assert_eq!(
        world.logs.removed_by(AGENT),
        [APISERVER, NETWORK, AGENT].map(|p| format!("{NS}/{p}")),
        "sorted, self last"
    );
}

/// Issue 36: self-GC never takes the checkpoint that serves a DaemonSet still targeting
/// the node. The kube-apiserver's checkpoint runs (its pod stopped during an outage and
/// has not run since: as after a failed handoff), then the agent's own DaemonSet is
/// deleted. Past the grace period every other checkpoint goes, but that one and the
/// agent's own stay, and the agent runs on and says so: a warning, an Event on the pod,
/// `/metrics`. Once the kube-apiserver's pod runs here again, everything goes and the
/// agent exits. It used to remove them all in one pass.
#[tokio::test]
async fn self_gc_spares_the_checkpoint_serving_a_daemon_set_that_targets_the_node() {
    let world = World::new(Local::Cri, &[APISERVER, AGENT, NETWORK]).await;
    // The kube-apiserver's DaemonSet asks for checkpoints and targets every node.
    world.api.set_get(
        &format!("/apis/apps/v1/namespaces/{NS}/daemonsets/kube-apiserver"),
        200,
        json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
               "metadata": {"name": "kube-apiserver", "namespace": NS, "uid": "uid-ds-kube-apiserver"},
               "spec": {"selector": {}, "template": {
                   "metadata": {"annotations": {"checkpointer.alpha.coreos.com/checkpoint": "true"}},
                   "spec": {"containers": [{"name": "main", "image": "kube-apiserver:v1.20.2"}]}}}}),
    );
    world.api.set_get(
        &format!("/api/v1/nodes/{NODE}"),
        200,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}),
    );
    let gc = ["--gc-strategy", "immediate", "--checkpoint-grace-period", "1s"];
    let agent = world.start_agent(AGENT, &gc);
    world.expect_files("checkpointed", &checkpointed(AGENT)).await;
    agent.expect_api("synced").await;

    world.api.set_outage(Reply::Refuse);
    agent.expect_api("unreachable").await;
    world.kill(APISERVER);
    let serving = with(checkpointed(AGENT), &[active(APISERVER)]);
    world
        .expect_files("the outage starts the checkpoint", &serving)
        .await;
    world.api.end_outage();
    agent.expect_api("synced").await;

    world.api.set_get(
        &format!("/apis/apps/v1/namespaces/{NS}/daemonsets/pod-checkpointer"),
        404,
        ckpt_testkit::status_body(404, "daemonsets.apps \"pod-checkpointer\" not found"),
    );
    assert!(world.api.delete("pods", NS, AGENT), "listed");
    world.kill(AGENT);
    let kept: Vec<String> = (serving.iter())
        .filter(|f| !f.contains(NETWORK))
        .cloned()
        .chain([JOURNAL.to_owned()])
        .collect();
    world
        .expect_files("the others go; the serving one and the agent's own stay", &kept)
        .await;
    eventually("self-GC held back on /metrics", || async {
        agent.metric("self_gc_deferred").await == 1.0
    })
    .await;
    eventually("the SelfGcDeferred Event", || async {
        !events_created(&world, APISERVER, "SelfGcDeferred").is_empty()
    })
    .await;
    world.looked_twice("held back").await;
    assert!(agent.is_running(), "the agent stays with the checkpoint it keeps");
    assert_eq!(world.logs.removed_by(AGENT), [format!("{NS}/{NETWORK}")]);

    // Its pod runs here again: nothing holds self-GC back any more.
    world.run(APISERVER);
    agent.exited().await.expect("exit 0 after self-GC");
    world
        .expect_files("self-GC removed everything", &[ETCD.to_owned()])
        .await;
    assert_eq!(
        world.logs.removed_by(AGENT),
        [NETWORK, APISERVER, AGENT].map(|p| format!("{NS}/{p}")),
        "the held-back one after the others, self last"
    );
}

/// The lock file deleted while the DaemonSet copy holds it: the holder locks the file at
/// the path again, so a copy started afterwards waits. Replaced by a file another process
/// locked first: the holder steps down, so that one copy acts, and takes the lock again
/// once it is free.
#[tokio::test]
async fn a_lock_file_deleted_or_replaced_while_held_leaves_one_copy_active() {
    let world = World::new(Local::Cri, &[APISERVER, AGENT, NETWORK, SCHEDULER]).await;
    let lock = world.path("run/pod-checkpointer.lock");
    let daemonset = world.start_agent(AGENT, &[]);
    daemonset.expect_ready("the DaemonSet copy", 200, "ok").await;
    world.expect_files("checkpointed", &checkpointed(AGENT)).await;

    std::fs::remove_file(&lock).expect("delete the lock file");
    eventually("the holder locking the path again", || async { lock.exists() }).await;
    let static_copy = world.start_agent(AGENT_STATIC, &[]);
    static_copy
        .expect_ready("a copy started afterwards waits", 200, "standby")
        .await;
    world.looked_twice("two copies").await;
    daemonset.expect_ready("the holder still acts", 200, "ok").await;
    static_copy.stop().await.expect("SIGTERM exits 0");

    // Atomically replaced by a file another process holds (a copy that opened the path
    // while it was missing, bootkube's checkpointer, `flock(1)`).
    let other_path = world.path("run/other.lock");
    let other = ckpt_lock::LockFile::new(&other_path, "another copy")
        .try_acquire()
        .expect("lock another file")
        .into_guard()
        .expect("a new file is free");
    std::fs::rename(&other_path, &lock).expect("replace the lock file");
    daemonset
        .expect_ready("the holder steps down", 200, "standby")
        .await;
    assert_eq!(daemonset.metric("lock_held").await, 0.0);
    drop(other);
    daemonset
        .expect_ready("and takes the lock again once it is free", 200, "ok")
        .await;
    world.looked_twice("after the lock came back").await;
    world.assert_files("nothing lost", &checkpointed(AGENT));
    daemonset.stop().await.expect("SIGTERM exits 0");
}

#[tokio::test]
async fn rolling_update_of_the_agent_with_grace_period() {
    rolling_update_of_the_agent("grace-period", Rollout::StaticCopy).await;
    rolling_update_of_the_agent("grace-period", Rollout::OldCopy).await;
}

#[tokio::test]
async fn rolling_update_of_the_agent_with_owner_reference() {
    rolling_update_of_the_agent("owner-reference", Rollout::StaticCopy).await;
    rolling_update_of_the_agent("owner-reference", Rollout::OldCopy).await;
}

/// `owner-reference`: a parent's DaemonSet rolls it (new name, same owner). The old
/// checkpoint goes as soon as the new one is written (never a moment without one), the
/// new pod's Secret/ConfigMap data is written under its own name and the old pod's is
/// removed with its checkpoint.
#[tokio::test]
async fn owner_reference_follows_a_rolled_parent() {
    const NEW: &str = "kube-apiserver-new";
    let world = World::new(Local::Cri, &[APISERVER, AGENT, NETWORK]).await;
    let agent = world.start_agent(AGENT, &["--gc-strategy", "owner-reference"]);
    world.expect_files("checkpointed", &checkpointed(AGENT)).await;

    assert!(world.api.delete("pods", NS, APISERVER));
    world.kill(APISERVER);
    agent.expect_api("synced").await;
    world.looked_twice("the old pod gone").await;
    world.assert_files(
        "owner present, no new pod yet: kept (grace period)",
        &with(checkpointed(AGENT), &[JOURNAL.to_owned()]),
    );

    let mut rolled_pod = apiserver_pod();
    rolled_pod["metadata"]["name"] = json!(NEW);
    rolled_pod["metadata"]["uid"] = json!(format!("uid-{NEW}"));
    world.api.apply("pods", NS, rolled_pod);
    world
        .cri
        .add_pod(NS, NEW, proto::SANDBOX_READY, &[proto::CONTAINER_RUNNING]);
    let rolled: Vec<String> = checkpointed(AGENT)
        .into_iter()
        .filter(|f| !f.contains(APISERVER))
        .chain([
            inactive(NEW),
            format!("ck/checkpoint-secrets/{NS}/{NEW}/apiserver-certs/tls.key"),
            format!("ck/checkpoint-configmaps/{NS}/{NEW}/apiserver-config/config.yaml"),
            JOURNAL.to_owned(),
        ])
        .collect();
    world
        .expect_files("the new checkpoint supersedes the old", &rolled)
        .await;
    expect_journal_absent(&world, "the new checkpoint supersedes the old", &[]).await;
    assert_eq!(world.logs.removed_by(AGENT), [format!("{NS}/{APISERVER}")]);
    world.looked_twice("after the rollout").await;
    world.assert_files("after the rollout: stable", &rolled);
    agent.stop().await.expect("SIGTERM exits 0");
}

/// The API server flaps every second for 30 s (hung, up, refusing, up, …) while one
/// parent runs and one crash-loops (listed, not running). With the harshest GC strategy:
/// nothing is ever removed; the running parent's checkpoint never starts; the other is
/// started at most once and stays up (an active checkpoint stays while its parent does
/// not run); nothing is deactivated. A final outage makes the activation certain.
#[tokio::test]
async fn api_flapping_every_second_for_30s() {
    let (world, agent) = checkpointed_and_synced(&["--gc-strategy", "immediate"]).await;
    world.looked_twice("settled").await;
    world.assert_files("API up, nothing new starts", &checkpointed(AGENT));

    let done = std::cell::Cell::new(false);
    let flap = async {
        for second in 0..30 {
            match second % 4 {
                0 => world.api.set_outage(Reply::Hang),
                2 => world.api.set_outage(Reply::Refuse),
                _ => world.api.end_outage(),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        world.api.end_outage();
        done.set(true);
    };
    let mut api_states = std::collections::BTreeSet::new();
    let mut network_active = Vec::new();
    let watch = async {
        while !done.get() {
            let files = world.files();
            for file in [
                inactive(APISERVER),
                inactive(AGENT),
                inactive(NETWORK),
                active(AGENT),
            ] {
                assert!(files.contains(&file), "{file} removed while flapping: {files:#?}");
            }
            assert!(
                !files.contains(&active(APISERVER)),
                "a running parent's checkpoint started"
            );
            let up = files.contains(&active(NETWORK));
            if network_active.last() != Some(&up) {
                network_active.push(up);
            }
            for state in ["unreachable", "reachable", "synced"] {
                if agent.metric(&format!("api_state{{state=\"{state}\"}}")).await == 1.0 {
                    api_states.insert(state);
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::join!(flap, watch);
    assert!(
        api_states.contains("unreachable"),
        "the agent saw an outage: {api_states:?}"
    );
    assert!(
        network_active == [false] || network_active == [false, true],
        "the crash-looping parent's checkpoint started at most once and stayed: {network_active:?}"
    );
    let network_started = network_active.last() == Some(&true);
    assert_eq!(
        agent.metric("activations_total").await,
        if network_started { 2.0 } else { 1.0 },
        "self, and the crash-looping parent's checkpoint only if it is up now"
    );
    assert_eq!(agent.metric_sum("removals_total").await, 0.0);
    assert_eq!(agent.metric("deactivations_total").await, 0.0);

    // One more, longer outage: now it certainly starts, once.
    world.api.set_outage(Reply::Refuse);
    let started = with(checkpointed(AGENT), &[active(NETWORK)]);
    world
        .expect_files(
            "the outage starts the crash-looping parent's checkpoint",
            &started,
        )
        .await;
    world.api.end_outage();
    agent.expect_api("synced").await;
    world.looked_twice("API back").await;
    world.assert_files("API back, parent still not running: stays", &started);
    assert_eq!(
        agent.metric("activations_total").await,
        2.0,
        "self, then the network once"
    );
    assert_eq!(agent.metric("deactivations_total").await, 0.0);
    assert_eq!(agent.metric_sum("removals_total").await, 0.0);

    // The parent runs at last: its checkpoint steps aside, once.
    world.run(NETWORK);
    world.expect_files("the parent runs", &checkpointed(AGENT)).await;
    agent.expect_count("deactivations_total", 1.0).await;
    agent.stop().await.expect("SIGTERM exits 0");
}

/// A disk that takes 1.5 s per fsync (every file written and directory synced under this
/// node's dirs) while the agent rewrites a checkpoint: the pass takes seconds, yet the
/// health endpoint keeps answering meanwhile and the API probe never takes the healthy
/// server for unreachable (disk work runs off the runtime thread). Before, the runtime
/// thread sat in the fsyncs: nothing answered until the pass was over, and the probe
/// timed out on the stall.
#[tokio::test]
async fn a_slow_disk_stalls_neither_health_nor_the_api_probe() {
    use ckpt_store::failpoint::{self, Action};

    let (world, agent) = checkpointed_and_synced(&[]).await;

    let slow = Action::Sleep(Duration::from_millis(1500));
    for point in ["fsops.fsync", "fsops.dirsync"] {
        failpoint::set(point, world.root.path(), slow.clone());
    }
    let mut upgraded = apiserver_pod();
    upgraded["spec"]["containers"][0]["image"] = json!("kube-apiserver:v1.20.3");
    world.api.apply("pods", NS, upgraded);
    let mut answered_while_writing = 0;
    while !world.read(&inactive(APISERVER)).contains("v1.20.3") {
        if agent
            .get("/healthz")
            .await
            .is_some_and(|(status, _)| status == 200)
            && !world.read(&inactive(APISERVER)).contains("v1.20.3")
        {
            answered_while_writing += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for point in ["fsops.fsync", "fsops.dirsync"] {
        failpoint::clear(point, world.root.path());
    }
    assert!(
        answered_while_writing >= 5,
        "/healthz answered {answered_while_writing} times while the checkpoint was written"
    );
    let outages: Vec<Value> = (world.logs.events().into_iter())
        .filter(|e| e["message"] == "API server unreachable")
        .collect();
    assert!(
        outages.is_empty(),
        "the slow disk was taken for an outage: {outages:#?}"
    );
    agent.stop().await.expect("SIGTERM exits 0");
}

/// A disk slow at start (after a power cut): the store is opened and tidied (temporary
/// files left by an interrupted write removed, 2 s per unlink here) while the health
/// endpoint keeps answering within a kubelet probe's default timeout (1 s). Before, the
/// store was opened on the runtime thread that serves `/healthz`: nothing answered until
/// the tidying was over (8 s: no answer at all), and a liveness probe would have
/// restarted the agent, which would have started over.
#[tokio::test]
async fn a_slow_disk_at_start_does_not_stall_health() {
    use ckpt_store::failpoint::{self, Action};

    let world = World::new(Local::Cri, &[APISERVER, AGENT]).await;
    let first = world.start_agent(AGENT, &[]);
    world.expect_files("checkpointed", &checkpointed(AGENT)).await;
    first.stop().await.expect("SIGTERM exits 0");
    let left = [
        "ck/.pod-checkpointer-crashed-1.tmp",
        "ck/.pod-checkpointer-crashed-2.tmp",
    ];
    for file in left {
        std::fs::write(world.path(file), "half a write").unwrap();
    }

    failpoint::set(
        "fsops.unlink",
        world.root.path(),
        Action::Sleep(Duration::from_millis(2000)),
    );
    let agent = world.start_agent(AGENT, &[]);
    let mut slowest = Duration::ZERO;
    let mut answered = 0;
    let started = Instant::now();
    while left.iter().any(|file| world.path(file).exists()) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the temporary files stay"
        );
        let asked = Instant::now();
        let answer = agent.get("/healthz").await;
        slowest = slowest.max(asked.elapsed());
        answered += usize::from(answer.is_some());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    failpoint::clear("fsops.unlink", world.root.path());
    assert!(
        slowest < Duration::from_secs(1),
        "/healthz took {slowest:?} to answer while the store was opened ({answered} answers)"
    );
    assert!(
        answered >= 5,
        "/healthz answered {answered} times while the store was opened"
    );
    agent.expect_ready("ready after the slow start", 200, "ok").await;
    world.assert_files("nothing else changed", &checkpointed(AGENT));
    agent.stop().await.expect("SIGTERM exits 0");
}

/// A read stuck on a failing disk while `/metrics` is rendered (it reads the token kept
/// for the static copy, 3 s here) holds that scrape only: `/healthz` answers meanwhile
/// within a probe's default timeout. Before, the scrape was rendered on the runtime thread
/// that answers the probes, and a Prometheus scrape could fail the liveness probe.
#[tokio::test]
async fn a_stuck_metrics_read_does_not_stall_health() {
    use ckpt_store::failpoint::{self, Action};

    let (world, agent) = checkpointed_and_synced(&[]).await;

    failpoint::set(
        "health.kept_token",
        world.root.path(),
        Action::Sleep(Duration::from_millis(3000)),
    );
    // The probe comes from a thread of its own: this test's runtime is the agent's.
    let port = agent.port;
    let probe = std::thread::spawn(move || {
        // The scrape is in its read by then.
        std::thread::sleep(Duration::from_millis(300));
        let asked = Instant::now();
        let status = http::get(port, "/healthz", Duration::from_secs(5)).map(|(status, _)| status);
        (status, asked.elapsed())
    });
    let scrape = agent.get("/metrics").await;
    let (health, took) = tokio::task::spawn_blocking(move || probe.join().expect("the probe"))
        .await
        .unwrap();
    failpoint::clear("health.kept_token", world.root.path());
    assert!(
        health == Some(200) && took < Duration::from_secs(1),
        "/healthz answered {health:?} after {took:?} while a scrape was stuck"
    );
    assert!(
        scrape.is_some_and(|(status, _)| status == 200),
        "the scrape is answered once the read returns"
    );
    agent.stop().await.expect("SIGTERM exits 0");
}

/// The Events created about `pod` with `reason` so far.
fn events_created(world: &World, pod: &str, reason: &str) -> Vec<Value> {
    world
        .api
        .event_writes()
        .into_iter()
        .filter(|(method, body)| {
            method == "POST" && body["regarding"]["name"] == pod && body["reason"] == reason
        })
        .map(|(_, body)| body)
        .collect()
}

/// An activation happens while the API server is unreachable, so its Event cannot be
/// published then: it is queued and created once the API server is back, with the time it
/// happened; the deactivation that follows is published at once.
#[tokio::test]
async fn activation_event_is_published_when_the_api_server_is_back() {
    let world = World::new(Local::Cri, &[APISERVER, AGENT, NETWORK]).await;
    let agent = world.start_agent(AGENT, &[]);
    world.expect_files("checkpointed", &checkpointed(AGENT)).await;
    agent.expect_api("synced").await;

    world.api.set_outage(Reply::Refuse);
    agent.expect_api("unreachable").await;
    let before = k8s_openapi::jiff::Timestamp::now();
    world.kill(APISERVER);
    let started = with(checkpointed(AGENT), &[active(APISERVER)]);
    world
        .expect_files("the outage starts the checkpoint", &started)
        .await;
    // The agent goes on trying the API server for a while before it is back.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let back = k8s_openapi::jiff::Timestamp::now();
    world.api.end_outage();
    agent.expect_api("synced").await;

    eventually("the activation Event", || async {
        !events_created(&world, APISERVER, "CheckpointActivated").is_empty()
    })
    .await;
    let created = events_created(&world, APISERVER, "CheckpointActivated");
    assert_eq!(created.len(), 1, "one Event: {created:#?}");
    let event = &created[0];
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["action"], "Activate");
    assert_eq!(event["reportingController"], "pod-checkpointer");
    assert_eq!(event["reportingInstance"], NODE);
    assert_eq!(event["regarding"]["uid"], format!("uid-{APISERVER}"));
    let at: k8s_openapi::jiff::Timestamp = event["eventTime"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no eventTime in {event}"));
    assert!(
        before <= at && at < back,
        "eventTime {at} is when the checkpoint was activated (between {before} and {back})"
    );

    world.run(APISERVER);
    world.expect_files("the parent runs", &checkpointed(AGENT)).await;
    eventually("the deactivation Event", || async {
        !events_created(&world, APISERVER, "CheckpointDeactivated").is_empty()
    })
    .await;
    agent.stop().await.expect("SIGTERM exits 0");
}

/// The API server rejects the holder's credentials (401: an expired or revoked token).
/// Nothing is activated or removed; `/readyz`, `/metrics` and the lock's holder record say
/// so; after `--unauthorized-handover` the holder releases the lock to the copy that waits
/// (here the test itself), waits for it again, and takes it back once it is free.
#[tokio::test]
async fn a_holder_whose_credentials_are_rejected_hands_the_lock_over() {
    let world = World::new(Local::Cri, &[APISERVER, AGENT, NETWORK]).await;
    let agent = world.start_agent(AGENT, &["--unauthorized-handover", "1s"]);
    world.expect_files("checkpointed", &checkpointed(AGENT)).await;
    agent.expect_api("synced").await;

    world.api.set_readyz(Reply::Status(401));
    // Even with a parent gone, nothing is activated: a rejected token says nothing about pods.
    world.kill(APISERVER);
    agent.expect_api("unauthorized").await;
    agent
        .expect_ready(
            "not ready while rejected",
            503,
            "unauthorized: the API server rejects this copy's credentials or forbids its pod reads",
        )
        .await;
    let lock_path = world.path("run/pod-checkpointer.lock");
    let holder = ckpt_lock::read_holder(&lock_path)
        .unwrap()
        .expect("a holder record");
    assert!(
        holder
            .status
            .as_deref()
            .is_some_and(|s| s.starts_with("api=unauthorized since")),
        "{holder}"
    );

    let waiter = ckpt_lock::LockFile::new(&lock_path, "the other copy");
    let guard = tokio::time::timeout(Duration::from_secs(WAIT), waiter.acquire())
        .await
        .expect("the holder hands the lock over")
        .expect("the lock is taken");
    assert_eq!(agent.metric("lock_handovers_total").await, 1.0);
    agent
        .expect_ready("waits for the lock again", 200, "standby")
        .await;
    assert!(agent.is_running(), "it waits for the lock, it does not exit");
    world.assert_files("nothing was removed or activated", &checkpointed(AGENT));

    // The other copy goes away; the credentials are accepted again.
    world.api.set_readyz(Reply::Normal);
    drop(guard);
    agent.expect_api("synced").await;
    agent.expect_ready("holds the lock again", 200, "ok").await;
    world
        .expect_files(
            "the parent's checkpoint is not started: the API is up",
            &checkpointed(AGENT),
        )
        .await;
    agent.stop().await.expect("SIGTERM exits 0");
}

/// Credentials that authenticate but may not read this node's pods (403 on the pod list
/// and watch: the RoleBinding gone, the kept token of another account) leave the holder
/// as blind as rejected ones: it hands the lock over too (issue 36; it used to stay
/// "reachable" for good). A 403 on Secrets and ConfigMaps only (RBAC for one object) is
/// no reason to.
#[tokio::test]
async fn a_holder_forbidden_to_read_its_pods_hands_the_lock_over() {
    let world = World::new(Local::Cri, &[APISERVER, AGENT, NETWORK]).await;
    let agent = world.start_agent(AGENT, &["--unauthorized-handover", "1s"]);
    world.expect_files("checkpointed", &checkpointed(AGENT)).await;
    agent.expect_api("synced").await;

    for resource in ["secrets", "configmaps"] {
        world.api.set_list(resource, NS, Reply::Status(403));
        world.api.set_watch(resource, NS, Reply::Status(403));
    }
    world.api.close_watches();
    // Well past the handover period: the pods are read, the lock stays.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    agent.expect_api("synced").await;
    assert_eq!(
        agent.metric("lock_handovers_total").await,
        0.0,
        "objects forbidden only"
    );
    agent.expect_ready("still ready", 200, "ok").await;

    world.api.set_list("pods", NS, Reply::Status(403));
    world.api.set_watch("pods", NS, Reply::Status(403));
    world.api.close_watches();
    // Even with a parent gone, nothing is activated: a forbidden read says nothing about pods.
    world.kill(APISERVER);
    agent.expect_api("unauthorized").await;
    let lock_path = world.path("run/pod-checkpointer.lock");
    let waiter = ckpt_lock::LockFile::new(&lock_path, "the other copy");
    let guard = tokio::time::timeout(Duration::from_secs(WAIT), waiter.acquire())
        .await
        .expect("the holder hands the lock over")
        .expect("the lock is taken");
    assert_eq!(agent.metric("lock_handovers_total").await, 1.0);
    agent
        .expect_ready("waits for the lock again", 200, "standby")
        .await;
    world.assert_files("nothing was removed or activated", &checkpointed(AGENT));

    // The bindings are back; the other copy goes away.
    for resource in ["pods", "secrets", "configmaps"] {
        world.api.set_list(resource, NS, Reply::Normal);
        world.api.set_watch(resource, NS, Reply::Normal);
    }
    drop(guard);
    agent.expect_api("synced").await;
    agent.expect_ready("holds the lock again", 200, "ok").await;
    world.assert_files("the API is up: nothing started", &checkpointed(AGENT));
    agent.stop().await.expect("SIGTERM exits 0");
}

/// A copy without credentials (the static copy after a reboot, before the other copy kept
/// any for it) probes `/readyz` anonymously. While the API server answers, a parent that
/// stops is left to its controller, as with credentials (it used to count the API as
/// unreachable and activate every checkpoint beside a healthy server; issue 36); once the
/// probe fails, the checkpoint starts.
#[tokio::test]
async fn a_copy_without_credentials_activates_only_while_the_api_server_does_not_answer() {
    let service_account = Path::new("/var/run/secrets/kubernetes.io/serviceaccount");
    if service_account.join("token").exists() {
        eprintln!("skipped: this process has a service-account token, so it has credentials");
        return;
    }
    let (world, url) = World::served(Local::Cri, &[APISERVER, AGENT, NETWORK]).await;
    let daemonset = world.start_agent(AGENT, &[]);
    world.expect_files("checkpointed", &checkpointed(AGENT)).await;
    daemonset.stop().await.expect("SIGTERM exits 0");

    // The kubeconfig the install renders, in the static copy, which has no service account.
    let kubeconfig = world.path("kubeconfig");
    let sa = service_account.display();
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {url}\n    \
             certificate-authority: {sa}/ca.crt\nusers:\n- name: sa\n  user:\n    tokenFile: {sa}/token\n\
             contexts:\n- name: local\n  context:\n    cluster: local\n    user: sa\ncurrent-context: local\n"
        ),
    )
    .expect("kubeconfig written");
    let kubeconfig = kubeconfig.display().to_string();
    let asked_before = world.api.count(|s| s.path != "/readyz");
    let copy = world.start_agent_from(
        AGENT_STATIC,
        &["--kubeconfig", &kubeconfig],
        ApiSource::Kubeconfig,
    );
    copy.expect_api("reachable").await;
    world.kill(APISERVER);
    world.looked_twice("the parent stopped").await;
    copy.expect_api("reachable").await;
    world.assert_files("the API server answers: nothing activated", &checkpointed(AGENT));
    assert_eq!(
        world.api.count(|s| s.path != "/readyz"),
        asked_before,
        "without credentials only /readyz is asked"
    );

    world.api.set_readyz(Reply::Status(503));
    world
        .expect_files(
            "the probe fails: the checkpoint starts",
            &with(checkpointed(AGENT), &[active(APISERVER)]),
        )
        .await;
    copy.stop().await.expect("SIGTERM exits 0");
}

/// The agent's own pod without the checkpoint annotation, or its namespace outside
/// `--namespaces`, leaves the node with no static copy after a reboot. It is said at start
/// and once per change, not every pass: a warning, and `/metrics`' `self_checkpointed`
/// (issue 36; it was silent).
#[tokio::test]
async fn an_agent_that_is_not_checkpointed_says_so() {
    const NOT_CHECKPOINTED: &str = "the agent's own pod is not checkpointed";
    const GAUGE: &str = "pod_checkpointer_self_checkpointed";
    let world = World::new(Local::Cri, &[APISERVER, AGENT, NETWORK]).await;
    let warnings = |why: &str| {
        (world.logs.events().iter())
            .filter_map(|e| e["message"].as_str().map(str::to_owned))
            .filter(|m| m.contains(NOT_CHECKPOINTED) && m.contains(why))
            .count()
    };
    let mut unannotated = agent_pod(AGENT, "pod-checkpointer:v1");
    unannotated["metadata"]["annotations"] = json!({});
    world.api.apply("pods", NS, unannotated);
    let agent = world.start_agent(AGENT, &[]);
    eventually("self_checkpointed 0", || async {
        agent.metrics().await.get(GAUGE) == Some(&0.0)
    })
    .await;
    for round in 0..2 {
        world.kill(NETWORK);
        world
            .looked_twice(&format!("round {round}: a parent stopped"))
            .await;
        world.run(NETWORK);
        world.looked_twice(&format!("round {round}: it runs again")).await;
    }
    assert_eq!(warnings("lacks the annotation"), 1, "once, not every pass");

    world
        .api
        .apply("pods", NS, agent_pod(AGENT, "pod-checkpointer:v1"));
    eventually("self_checkpointed 1", || async {
        agent.metrics().await.get(GAUGE) == Some(&1.0)
    })
    .await;
    agent.stop().await.expect("SIGTERM exits 0");

    let agent = world.start_agent(AGENT, &["--namespaces", "cni"]);
    eventually("self_checkpointed 0 again", || async {
        agent.metrics().await.get(GAUGE) == Some(&0.0)
    })
    .await;
    world.looked_twice("more passes").await;
    assert_eq!(warnings("is not in --namespaces"), 1, "said at start");
    agent.stop().await.expect("SIGTERM exits 0");
}

/// A namespace removed from `--namespaces` while a checkpoint of it serves (activated in
/// an outage): its pods are no longer watched, but the local view still says whether its
/// parent runs, so the checkpoint is kept while it does not and retired once it does
/// (issue 36; it was kept for good: the local view covered the allowed namespaces only).
#[tokio::test]
async fn an_active_checkpoint_of_a_namespace_no_longer_allowed_goes_once_its_parent_runs() {
    const CNI: &str = "cni";
    const FLANNEL: &str = "flannel-abc";
    let world = World::new(Local::Cri, &[APISERVER, AGENT, NETWORK]).await;
    let mut flannel = parent(FLANNEL, "flannel", "flannel:v0.13", json!([]));
    flannel["metadata"]["namespace"] = json!(CNI);
    world.api.set_objects("pods", CNI, vec![flannel]);
    let up = [proto::CONTAINER_RUNNING];
    world.cri.add_pod(CNI, FLANNEL, proto::SANDBOX_READY, &up);
    let flannel_inactive = format!("ck/inactive-manifests/{CNI}_{FLANNEL}.json");
    let flannel_active = format!("manifests/{CNI}_{FLANNEL}.json");
    let both = format!("{NS},{CNI}");
    let agent = world.start_agent(AGENT, &["--namespaces", &both]);
    let checkpointed_too = with(checkpointed(AGENT), std::slice::from_ref(&flannel_inactive));
    world.expect_files("checkpointed", &checkpointed_too).await;

    world.api.set_outage(Reply::Refuse);
    world.cri.remove_pod(CNI, FLANNEL);
    let serving = with(checkpointed_too, &[flannel_active]);
    world.expect_files("flannel's checkpoint serves", &serving).await;
    agent.stop().await.expect("SIGTERM exits 0");

    // cni is no longer in --namespaces; the API is back.
    world.api.end_outage();
    let agent = world.start_agent(AGENT, &[]);
    agent.expect_api("synced").await;
    world.looked_twice("flannel still down").await;
    world.looked_twice("and again").await;
    world.assert_files("kept while its parent does not run", &serving);
    world.cri.add_pod(CNI, FLANNEL, proto::SANDBOX_READY, &up);
    world
        .expect_files("retired once its parent runs", &checkpointed(AGENT))
        .await;
    agent.stop().await.expect("SIGTERM exits 0");
}

/// Modification time and inode: a file rewritten (even with the same bytes) changes.
fn identity_of(world: &World, rel: &str) -> (std::time::SystemTime, u64) {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(world.path(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
    (meta.modified().expect("mtime"), meta.ino())
}

/// The container runtime and the kubelet both stop answering. The local view is unknown
/// (not "nothing runs"): with the API up nothing starts or stops; with the API down the
/// checkpoints start once (availability first) and are never rewritten or stopped while
/// the API comes and goes.
/// Issue 36: with the CRI off, the static copy has no service-account token (a static pod
/// mounts none), so a kubelet with webhook authentication answered its `/pods` 401 and its
/// local view stayed unknown for as long as it held the lock: checkpoints it activated in
/// an outage were never stopped. It now calls a kubelet whose certificate `--kubelet-ca`
/// verifies with the kept token of its account, once the DaemonSet copy has written it.
#[tokio::test]
async fn the_static_copy_reads_the_kubelet_with_its_kept_token() {
    let mut world = World::new(Local::Kubelet, &[]).await;
    world.kubelet = FakeKubelet::start(true).await;
    world.kubelet.require_token("kept-token");
    for pod in [APISERVER, AGENT, NETWORK] {
        world.run(pod);
    }
    let ca = world.path("kubelet-ca.pem");
    std::fs::write(&ca, ckpt_testkit::TEST_CA_PEM).expect("write the CA");
    let ca = ca.display().to_string();
    let agent = world.start_agent(AGENT_STATIC, &["--kubelet-ca", &ca]);
    agent.expect_api("synced").await;
    // No kept token yet: the kubelet refuses, the local view is unknown.
    eventually("the kubelet refusing a request without a token", || async {
        lock_kubelet(&world).auth.iter().any(Option::is_none)
    })
    .await;
    assert_eq!(agent.metric("local_view_available").await, 0.0);

    let layout = ckpt_store::Layout::new(world.path("ck"), world.path("manifests"));
    let kept = layout.credentials_token_path();
    std::fs::create_dir_all(kept.parent().expect("a parent")).expect("the agent's dir");
    std::fs::write(&kept, "kept-token\n").expect("write the kept token");
    eventually("the local view known through the kept token", || async {
        agent.metric("local_view_available").await == 1.0
    })
    .await;
    assert_eq!(
        lock_kubelet(&world).auth.last().cloned().flatten().as_deref(),
        Some("Bearer kept-token")
    );
    agent.stop().await.expect("SIGTERM exits 0");
}

fn lock_kubelet(world: &World) -> std::sync::MutexGuard<'_, ckpt_testkit::KubeletState> {
    world
        .kubelet
        .state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn local_view_unknown(local: Local) {
    let world = World::new(local, &[APISERVER, AGENT, NETWORK]).await;
    let agent = world.start_agent(AGENT, &["--gc-strategy", "immediate"]);
    world.expect_files("checkpointed", &checkpointed(AGENT)).await;
    agent.expect_api("synced").await;
    assert_eq!(agent.metric("local_view_available").await, 1.0);

    world.cri.stop();
    world.kubelet.stop();
    // The gauge is set at the end of a pass, after its plan ran.
    eventually("a pass with the local view unknown", || async {
        agent.metric("local_view_available").await == 0.0
    })
    .await;
    world.assert_files(
        "local view unknown, API up: nothing starts or stops",
        &checkpointed(AGENT),
    );

    world.api.set_outage(Reply::Refuse);
    let started = with(checkpointed(AGENT), &[active(APISERVER), active(NETWORK)]);
    world
        .expect_files("API down, local unknown: availability first", &started)
        .await;
    let written: Vec<_> = [active(APISERVER), active(NETWORK), active(AGENT)]
        .iter()
        .map(|f| identity_of(&world, f))
        .collect();
    for round in 0..2 {
        world.api.end_outage();
        agent.expect_api("synced").await;
        world.assert_files(
            &format!("round {round}: API up, local unknown: unchanged"),
            &started,
        );
        world.api.set_outage(Reply::Refuse);
        agent.expect_api("unreachable").await;
        world.assert_files(&format!("round {round}: API down again: unchanged"), &started);
    }
    let rewritten: Vec<_> = [active(APISERVER), active(NETWORK), active(AGENT)]
        .iter()
        .map(|f| identity_of(&world, f))
        .collect();
    assert_eq!(written, rewritten, "no manifest rewritten");
    assert_eq!(
        agent.metric("activations_total").await,
        3.0,
        "self, then each checkpoint once"
    );
    assert_eq!(agent.metric("deactivations_total").await, 0.0);
    assert_eq!(agent.metric("local_view_available").await, 0.0, "still unknown");
    assert_eq!(agent.metric_sum("removals_total").await, 0.0);
    world.api.end_outage();
    agent.stop().await.expect("SIGTERM exits 0");
}

/// The CRI runtime's answer past the client's 16 MiB (a busy node's annotations): the
/// local view is unknown, never "nothing runs", and `/metrics` counts the oversized
/// answers (`cri_answers_too_large_total`, issue 36: never asserted before).
#[tokio::test]
async fn a_cri_answer_too_large_is_counted_on_metrics() {
    let world = World::new(Local::Cri, &[APISERVER, AGENT]).await;
    let agent = world.start_agent(AGENT, &[]);
    world.expect_files("checkpointed", &checkpointed(AGENT)).await;
    assert_eq!(agent.metric("cri_answers_too_large_total").await, 0.0);
    {
        let mut st = world.cri.state.lock().unwrap_or_else(|e| e.into_inner());
        let pad = || [("pad".to_owned(), "x".repeat(17 << 20))].into();
        for c in &mut st.containers {
            c.annotations = pad();
        }
    }
    eventually("an oversized answer counted on /metrics", || async {
        agent.metric("cri_answers_too_large_total").await >= 1.0
    })
    .await;
    assert_eq!(agent.metric("local_view_available").await, 0.0, "unknown");
    world.assert_files("nothing changed on an unknown view", &checkpointed(AGENT));
    agent.stop().await.expect("SIGTERM exits 0");
}

#[tokio::test]
async fn cri_and_kubelet_down_with_the_cri_on() {
    local_view_unknown(Local::Cri).await;
}

#[tokio::test]
async fn kubelet_down_with_the_cri_off() {
    local_view_unknown(Local::Kubelet).await;
}

/// Whether this process runs as root (the owner of `/proc/self`): `chattr +i` needs it.
fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// The tests of this file that need root.
const ROOT_ONLY: &[&str] = &[
    "self_gc_goes_on_past_a_checkpoint_it_cannot_remove",
    "gc_timers_advance_while_the_journal_cannot_be_saved",
];

/// The root-only tests, run by another user (this test binary again, under `setpriv`):
/// each says it is skipped and why, and passes (was: failed, `chattr` refused).
#[test]
fn root_only_tests_skip_with_a_reason_when_not_root() {
    if !running_as_root() {
        eprintln!("skipped: running the tests as another user needs root");
        return;
    }
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(std::env::current_exe().expect("this test binary"))
        .args(ROOT_ONLY)
        .args(["--exact", "--nocapture", "--test-threads=1"])
        .output();
    let out = match out {
        Ok(out) => out,
        Err(e) => {
            eprintln!("skipped: setpriv is not available: {e}");
            return;
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("{} passed", ROOT_ONLY.len())),
        "{stdout}"
    );
    assert_eq!(stderr.matches("skipped: ").count(), ROOT_ONLY.len(), "{stderr}");
}

/// `chattr +i` on a path while this lives: even root cannot remove what is inside, so a
/// removal fails for real (root only: see [`running_as_root`]).
struct Immutable(PathBuf);

impl Immutable {
    fn set(path: PathBuf) -> Immutable {
        chattr("+i", &path);
        Immutable(path)
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        chattr("-i", &self.0);
    }
}

fn chattr(flag: &str, path: &Path) {
    let status = std::process::Command::new("chattr")
        .arg(flag)
        .arg(path)
        .status()
        .expect("chattr (e2fsprogs) runs");
    assert!(status.success(), "chattr {flag} {}: {status}", path.display());
}

/// The API server's and the agent's own pods, checkpointed by an agent run with `args`,
/// which sees the API synced.
async fn checkpointed_and_synced(args: &[&str]) -> (World, Agent) {
    let world = World::new(Local::Cri, &[APISERVER, AGENT]).await;
    let agent = world.start_agent(AGENT, args);
    world.expect_files("checkpointed", &checkpointed(AGENT)).await;
    agent.expect_api("synced").await;
    (world, agent)
}

/// Data a crash left without its checkpoint (between a checkpoint's data and its
/// manifest, of a pod since gone) is removed by the first synced pass; a file that is not
/// ours in the data roots stays (was: the data stayed until `drain`; issue 36).
#[tokio::test]
async fn data_of_no_checkpoint_is_removed_once_synced() {
    let world = World::new(Local::Cri, &[APISERVER, AGENT]).await;
    let orphan = world.path(&format!("ck/checkpoint-secrets/{NS}/gone/certs/tls.key"));
    std::fs::create_dir_all(orphan.parent().unwrap()).unwrap();
    std::fs::write(&orphan, "key").unwrap();
    let stray = "ck/checkpoint-configmaps/not-a-pod-dir".to_owned();
    std::fs::create_dir_all(world.path("ck/checkpoint-configmaps")).unwrap();
    std::fs::write(world.path(&stray), "x").unwrap();
    let agent = world.start_agent(AGENT, &[]);
    agent.expect_api("synced").await;
    world
        .expect_files("the orphan data removed", &with(checkpointed(AGENT), &[stray]))
        .await;
}

/// The apiserver, network and agent pods, checkpointed by the DaemonSet copy on a 2 s
/// grace period, with a synced API view.
async fn checkpointed_on_a_short_grace_period() -> (World, Agent) {
    let world = World::new(Local::Cri, &[APISERVER, AGENT, NETWORK]).await;
    let agent = world.start_agent(
        AGENT,
        &["--gc-strategy", "grace-period", "--checkpoint-grace-period", "2s"],
    );
    world.expect_files("checkpointed", &checkpointed(AGENT)).await;
    agent.expect_api("synced").await;
    (world, agent)
}

/// Self-GC with one checkpoint that cannot be removed: the others still go (one stuck
/// checkpoint must not keep the rest of the node's), the agent's own stays, and the agent
/// keeps running to retry; once the obstacle is gone, it finishes, removes itself last
/// and exits 0.
#[tokio::test]
async fn self_gc_goes_on_past_a_checkpoint_it_cannot_remove() {
    if !running_as_root() {
        eprintln!("skipped: a directory even the agent cannot remove (chattr +i) needs root");
        return;
    }
    let (world, agent) = checkpointed_on_a_short_grace_period().await;

    // The apiserver's secrets (sorted first among the removals) cannot be removed.
    let stuck =
        Immutable::set(world.path(&format!("ck/checkpoint-secrets/{NS}/{APISERVER}/apiserver-certs")));
    // The agent's DaemonSet is deleted (its GET answers 404). It used to stay as it was (no
    // pod template, this node's Node not found: an unknown scheduling) and the strategy
    // decided self-GC; issue 36's rule keeps everything then, so the deletion is read.
    world.api.set_get(
        &format!("/apis/apps/v1/namespaces/{NS}/daemonsets/pod-checkpointer"),
        404,
        ckpt_testkit::status_body(404, "daemonsets.apps \"pod-checkpointer\" not found"),
    );
    for pod in [APISERVER, NETWORK, AGENT] {
        assert!(world.api.delete("pods", NS, pod), "{pod} was listed");
        world.kill(pod);
    }
    eventually("the network checkpoint is removed", || async {
        !world.path(&inactive(NETWORK)).exists()
    })
    .await;
    world.looked_twice("after a failed self-GC").await;
    assert!(agent.is_running(), "it retries, it does not exit");
    for kept in [active(AGENT), inactive(AGENT)] {
        assert!(world.path(&kept).exists(), "{kept}: self goes last");
    }
    assert!(agent.metric("write_errors_total").await >= 1.0);

    drop(stuck);
    agent.exited().await.expect("exit 0 after self-GC");
    world
        .expect_files("self-GC removed everything", &[ETCD.to_owned()])
        .await;
}

/// The state journal cannot be saved (a full, read-only or failing disk): the GC timers
/// still run in memory, so a deleted parent's checkpoint is removed after the grace
/// period, and the journal catches up once it can be written.
#[tokio::test]
async fn gc_timers_advance_while_the_journal_cannot_be_saved() {
    if !running_as_root() {
        eprintln!("skipped: a journal dir even the agent cannot write (chattr +i) needs root");
        return;
    }
    let (world, agent) = checkpointed_on_a_short_grace_period().await;

    let state_dir = world.path("ck/pod-checkpointer");
    std::fs::create_dir_all(&state_dir).unwrap();
    // The journal as saved so far (each parent's content as first seen), read once it can
    // no longer change: a pass still under way may save it until then.
    let unsaved = Immutable::set(state_dir);
    let saved = std::fs::read_to_string(world.path(JOURNAL)).unwrap_or_default();
    assert!(world.api.delete("pods", NS, NETWORK), "listed");
    world.kill(NETWORK);
    eventually("the deleted parent's checkpoint is removed", || async {
        !world.path(&inactive(NETWORK)).exists()
    })
    .await;
    assert!(agent.metric("write_errors_total").await >= 1.0);
    let now = std::fs::read_to_string(world.path(JOURNAL)).unwrap_or_default();
    assert_eq!(now, saved, "the journal could not be written");

    drop(unsaved);
    // The next pass (any change will do) saves the state it kept in memory.
    assert!(world.api.delete("pods", NS, APISERVER), "listed");
    world.kill(APISERVER);
    eventually("the journal is saved again", || async {
        std::fs::read_to_string(world.path(JOURNAL)).is_ok_and(|j| j != saved)
    })
    .await;
    agent.stop().await.expect("SIGTERM exits 0");
}

/// The node's kubelet is v1.20 (read from its Node), the API server newer: a parent with
/// an env var named `1ST` runs (a kubelet trusts the API server's pods), but that kubelet
/// would refuse its checkpoint as a static pod (C-like env names only, before 1.35). It is
/// not written; the refusal is an Event naming the field and the kubelet, counted once;
/// the other parents are checkpointed as always.
#[tokio::test]
async fn a_checkpoint_the_nodes_kubelet_would_not_run_is_not_written() {
    const ODD: &str = "kube-proxy-abc";
    let world = World::new(Local::Cri, &[APISERVER, AGENT]).await;
    world.api.set_get(
        &format!("/api/v1/nodes/{NODE}"),
        200,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
            "status": {"nodeInfo": {"kubeletVersion": "v1.20.2", "kubeProxyVersion": "v1.20.2",
                "architecture": "amd64", "bootID": "b", "containerRuntimeVersion": "containerd://1.6.20",
                "kernelVersion": "6.1.0", "machineID": "m", "operatingSystem": "linux",
                "osImage": "Debian GNU/Linux 12", "systemUUID": "u"}}}),
    );
    let mut odd = parent(ODD, "kube-proxy", "kube-proxy:v1.20.2", json!([]));
    odd["spec"]["containers"][0]["env"] = json!([{"name": "1ST", "value": "x"}]);
    world.api.apply("pods", NS, odd);
    let agent = world.start_agent(AGENT, &[]);
    world.expect_files("checkpointed", &checkpointed(AGENT)).await;
    eventually("the refusal Event", || async {
        !events_created(&world, ODD, "CheckpointRefused").is_empty()
    })
    .await;
    let note = events_created(&world, ODD, "CheckpointRefused")[0]["note"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        note.contains("the kubelet of node-1 (v1.20)") && note.contains("spec.containers[0].env[0].name"),
        "{note}"
    );
    world.looked_twice("settled").await;
    world.assert_files("still not written", &checkpointed(AGENT));
    agent.expect_count("refused_total", 2.0).await;
    agent.stop().await.expect("SIGTERM exits 0");
}

/// A parent from an API server newer than the agent's Kubernetes model, carrying fields the
/// model does not know: a checkpoint written from the model would silently lose them. It is
/// not written; the refusal is an Event naming each field; the other parents are
/// checkpointed as always.
#[tokio::test]
async fn a_pod_with_fields_the_agent_does_not_know_is_not_checkpointed() {
    const NEWER: &str = "kube-proxy-new";
    let world = World::new(Local::Cri, &[APISERVER, AGENT]).await;
    let mut newer = parent(NEWER, "kube-proxy", "kube-proxy:v1.38.0", json!([]));
    newer["spec"]["futureField"] = json!({ "enabled": true });
    newer["spec"]["containers"][0]["futureKnob"] = json!("on");
    world.api.apply("pods", NS, newer);
    let agent = world.start_agent(AGENT, &[]);
    world.expect_files("checkpointed", &checkpointed(AGENT)).await;
    eventually("the refusal Event", || async {
        !events_created(&world, NEWER, "CheckpointRefused").is_empty()
    })
    .await;
    let note = events_created(&world, NEWER, "CheckpointRefused")[0]["note"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        note.contains("fields this agent does not know")
            && note.contains("spec.futureField")
            && note.contains("spec.containers[0].futureKnob"),
        "{note}"
    );
    world.looked_twice("settled").await;
    world.assert_files("still not written", &checkpointed(AGENT));
    agent.stop().await.expect("SIGTERM exits 0");
}

/// A failing disk: every fsync (then every rename) under this node's dirs returns EIO
/// while the agent rewrites a checkpoint (its parent upgraded) and, in an outage, tries to
/// activate another. Nothing half-written appears: the inactive copy keeps its old
/// version, whole; no temporary file is left; nothing reaches the kubelet's dir. Every
/// failure is counted, the agent stays healthy and retries; once the disk works again,
/// the activation and the new version follow without a restart.
#[tokio::test]
async fn a_disk_failing_with_eio_on_fsync_loses_nothing_and_is_retried() {
    disk_failing_with_eio_at(Eio::before_rename("fsops.fsync")).await;
}

#[tokio::test]
async fn a_disk_failing_with_eio_on_rename_loses_nothing_and_is_retried() {
    disk_failing_with_eio_at(Eio::before_rename("fsops.rename")).await;
}

#[tokio::test]
async fn a_disk_failing_with_eio_on_a_directory_sync_loses_nothing_and_is_retried() {
    disk_failing_with_eio_at(Eio {
        point: "fsops.dirsync",
        after_rename: true,
    })
    .await;
}

#[tokio::test]
async fn a_disk_failing_with_eio_on_reads_loses_nothing_and_is_retried() {
    // The rewrite compares with the file on disk, the activation copies the inactive one.
    disk_failing_with_eio_at(Eio::before_rename("fsops.read")).await;
}

/// Where EIO strikes a write, and what that leaves.
struct Eio {
    /// The failpoint.
    point: &'static str,
    /// It strikes after the rename: the new version is in place, whole, and the step
    /// still counts as failed (a directory sync: the rename may not be durable).
    after_rename: bool,
}

impl Eio {
    fn before_rename(point: &'static str) -> Eio {
        Eio {
            point,
            after_rename: false,
        }
    }
}

async fn disk_failing_with_eio_at(eio: Eio) {
    use ckpt_store::failpoint::{self, Action};

    let (world, agent) = checkpointed_and_synced(&[]).await;
    let before = world.read(&inactive(APISERVER));

    failpoint::set(eio.point, world.root.path(), Action::Error(5));
    let mut upgraded = apiserver_pod();
    upgraded["spec"]["containers"][0]["image"] = json!("kube-apiserver:v1.20.3");
    world.api.apply("pods", NS, upgraded);
    eventually("a failed write", || async {
        agent.metric("write_errors_total").await >= 1.0
    })
    .await;
    world.looked_twice("while the disk fails").await;
    world.assert_files("nothing half-written", &checkpointed(AGENT));
    let now = world.read(&inactive(APISERVER));
    if eio.after_rename {
        assert!(now.contains("v1.20.3"), "the new version, whole: {now}");
    } else {
        assert_eq!(now, before, "the old version, whole");
    }
    serde_json::from_str::<Value>(&now).expect("a whole manifest");

    // An outage: the crash-looping parent's checkpoint cannot be activated either, and the
    // failed activation is retried (soon, not at the next resync 30 s later).
    let failed = agent.metric("write_errors_total").await;
    world.api.set_outage(Reply::Refuse);
    agent.expect_api("unreachable").await;
    let activated = with(checkpointed(AGENT), &[active(NETWORK)]);
    if !eio.after_rename {
        eventually(
            "the activation failing, and failing again when retried",
            || async { agent.metric("write_errors_total").await >= failed + 2.0 },
        )
        .await;
        world.looked_twice("while the disk fails, in the outage").await;
        world.assert_files("nothing reaches the kubelet's dir", &checkpointed(AGENT));
    } else {
        // The manifest is in the kubelet's dir, whole, as soon as it is renamed there.
        world
            .expect_files("the activation, whatever the disk says after it", &activated)
            .await;
        assert_eq!(world.read(&active(NETWORK)), world.read(&inactive(NETWORK)));
    }
    let (health, _) = agent.get("/healthz").await.expect("/healthz answers");
    assert_eq!(health, 200, "the agent stays healthy");

    failpoint::clear(eio.point, world.root.path());
    world
        .expect_files("the activation once the disk works", &activated)
        .await;
    world.api.end_outage();
    agent.expect_api("synced").await;
    eventually("the new version written", || async {
        world.read(&inactive(APISERVER)).contains("v1.20.3")
    })
    .await;
    agent.stop().await.expect("SIGTERM exits 0");
}

/// EIO on every unlink: a deactivation and a removal fail and are retried; the
/// checkpoint stays whole meanwhile (running beside its parent is better than a half
/// one), and both finish once the disk works.
#[tokio::test]
async fn a_disk_failing_with_eio_on_unlink_keeps_checkpoints_whole_and_is_retried() {
    use ckpt_store::failpoint::{self, Action};

    let world = World::new(Local::Cri, &[APISERVER, AGENT, NETWORK]).await;
    let agent = world.start_agent(
        AGENT,
        &["--gc-strategy", "grace-period", "--checkpoint-grace-period", "1s"],
    );
    world.expect_files("checkpointed", &checkpointed(AGENT)).await;
    world.api.set_outage(Reply::Refuse);
    world.kill(NETWORK);
    let activated = with(checkpointed(AGENT), &[active(NETWORK)]);
    world.expect_files("activated in the outage", &activated).await;

    failpoint::set("fsops.unlink", world.root.path(), Action::Error(5));
    let failed = agent.metric("write_errors_total").await;
    // The parent is back: its checkpoint steps aside, but cannot.
    world.api.end_outage();
    world.run(NETWORK);
    agent.expect_api("synced").await;
    // The kube-apiserver parent is deleted: removed after the grace period, but cannot be.
    world.api.delete("pods", NS, APISERVER);
    world.kill(APISERVER);
    eventually(
        "the deactivation and the removal failing, and failing again",
        || async { agent.metric("write_errors_total").await >= failed + 3.0 },
    )
    .await;
    world.looked_twice("while unlink fails").await;
    for file in [inactive(NETWORK), active(NETWORK), inactive(APISERVER)] {
        serde_json::from_str::<Value>(&world.read(&file)).expect("a whole manifest");
    }
    let left = world.files();
    assert!(left.contains(&active(NETWORK)), "still active: {left:#?}");
    assert!(left.contains(&inactive(APISERVER)), "not removed: {left:#?}");
    let (health, _) = agent.get("/healthz").await.expect("/healthz answers");
    assert_eq!(health, 200, "the agent stays healthy");

    failpoint::clear("fsops.unlink", world.root.path());
    world
        .expect_files(
            "stepped aside and removed once the disk works",
            &with(
                vec![inactive(AGENT), active(AGENT), inactive(NETWORK), ETCD.to_owned()],
                &[JOURNAL.to_owned()],
            ),
        )
        .await;
    agent.stop().await.expect("SIGTERM exits 0");
}

/// Issue 21 with fakes: the API server's DaemonSet rolls it to a pod whose content was
/// never proven while the known-good checkpoint serves. The new pod gets the node (the
/// checkpoint stops), is not Ready within `--handoff-timeout`, and the known-good
/// checkpoint comes back and stays; each step is an Event on the new pod and a count.
#[tokio::test]
async fn a_parent_that_never_becomes_ready_hands_the_node_back() {
    const NEW: &str = "kube-apiserver-new";
    let world = World::new(Local::Cri, &[APISERVER, AGENT]).await;
    let args = ["--gc-strategy", "owner-reference", "--handoff-timeout", "3s"];
    let agent = world.start_agent(AGENT, &args);
    world.expect_files("checkpointed", &checkpointed(AGENT)).await;
    agent.stop().await.expect("SIGTERM exits 0");
    // The parent proved this content (a minute Ready, what `known_good::track` records).
    let manifest: Value = serde_json::from_str(&world.read(&inactive(APISERVER))).expect("JSON");
    let hash = manifest["metadata"]["annotations"]["checkpointer.alpha.coreos.com/spec-hash"].clone();
    world.write_journal(json!({
        "absent_since": [],
        "known_good": [{"namespace": NS, "name": APISERVER, "spec_hash": hash, "since": 0}],
    }));

    let agent = world.start_agent(AGENT, &args);
    agent.expect_api("synced").await;
    // The rollout deletes the proven pod, and the API server with it: the checkpoint serves.
    assert!(world.api.delete("pods", NS, APISERVER));
    world.kill(APISERVER);
    world.api.set_outage(Reply::Refuse);
    eventually("the known-good checkpoint active", || async {
        world.path(&active(APISERVER)).exists()
    })
    .await;
    // Back through the checkpoint, the API lists the new pod, which crash-loops: caught
    // running, it gets the node.
    let mut rolled_pod = apiserver_pod();
    rolled_pod["metadata"]["name"] = json!(NEW);
    rolled_pod["metadata"]["uid"] = json!(format!("uid-{NEW}"));
    rolled_pod["spec"]["containers"][0]["image"] = json!("kube-apiserver:bad");
    world.api.apply("pods", NS, rolled_pod);
    world.api.end_outage();
    eventually("the new pod checkpointed beside the known-good one", || async {
        world.path(&inactive(NEW)).exists()
    })
    .await;
    world.looked_twice("the new pod checkpointed").await;
    assert!(
        world.path(&active(APISERVER)).exists() && world.path(&inactive(APISERVER)).exists(),
        "the known-good revision outlives the strategy's verdict and keeps serving"
    );
    assert!(
        !world.path(&active(NEW)).exists(),
        "the unproven revision never starts"
    );
    world
        .cri
        .add_pod(NS, NEW, proto::SANDBOX_READY, &[proto::CONTAINER_RUNNING]);
    eventually("the known-good checkpoint steps aside", || async {
        !world.path(&active(APISERVER)).exists()
    })
    .await;
    let stepped_aside = Instant::now();
    world.cri.remove_pod(NS, NEW);
    world.api.set_outage(Reply::Refuse);
    // Not Ready by the deadline (the API is gone with the checkpoint): it comes back.
    eventually("the known-good checkpoint back", || async {
        world.path(&active(APISERVER)).exists()
    })
    .await;
    assert!(
        stepped_aside.elapsed() >= Duration::from_millis(2500),
        "back only at the deadline, after {:?}",
        stepped_aside.elapsed()
    );
    // The rejected pod runs again: the checkpoint stays.
    world.api.end_outage();
    world
        .cri
        .add_pod(NS, NEW, proto::SANDBOX_READY, &[proto::CONTAINER_RUNNING]);
    world.looked_twice("the rejected pod running").await;
    assert!(
        world.path(&active(APISERVER)).exists(),
        "stays while the rejected pod runs"
    );
    let handoffs = |step: &str| format!("handoffs_total{{step=\"{step}\"}}");
    agent.expect_count(&handoffs("started"), 1.0).await;
    agent.expect_count(&handoffs("failed"), 1.0).await;
    agent.expect_count(&handoffs("ready"), 0.0).await;
    eventually(
        "the HandoffStarted and HandoffFailed Events on the new pod",
        || async {
            let reasons: Vec<String> = (world.api.event_writes().into_iter())
                .filter(|(_, e)| e["regarding"]["name"] == NEW)
                .filter_map(|(_, e)| e["reason"].as_str().map(str::to_owned))
                .collect();
            reasons.contains(&"HandoffStarted".to_owned()) && reasons.contains(&"HandoffFailed".to_owned())
        },
    )
    .await;
    agent.stop().await.expect("SIGTERM exits 0");
}

/// Issue 21 with fakes: two proven revisions of the API server's DaemonSet on disk; an
/// outage activates the newer one, whose static pod then crash-loops (its restarts rise in
/// the runtime): the previous known-good revision replaces it, once, with a count and an
/// Event on the set-aside revision's pod.
#[tokio::test]
async fn an_active_revision_that_crash_loops_is_replaced_by_the_previous_known_good_one() {
    const NEW: &str = "kube-apiserver-new";
    let new_static = format!("{NEW}-{NODE}");
    let world = World::new(Local::Cri, &[APISERVER, AGENT]).await;
    let args = ["--gc-strategy", "owner-reference"];
    let agent = world.start_agent(AGENT, &args);
    world.expect_files("checkpointed", &checkpointed(AGENT)).await;
    // The DaemonSet rolls the API server to a new pod (another image), checkpointed beside it.
    let mut rolled_pod = apiserver_pod();
    rolled_pod["metadata"]["name"] = json!(NEW);
    rolled_pod["metadata"]["uid"] = json!(format!("uid-{NEW}"));
    rolled_pod["spec"]["containers"][0]["image"] = json!("kube-apiserver:v2");
    world.api.apply("pods", NS, rolled_pod);
    world
        .cri
        .add_pod(NS, NEW, proto::SANDBOX_READY, &[proto::CONTAINER_RUNNING]);
    eventually("the new pod checkpointed", || async {
        world.path(&inactive(NEW)).exists()
    })
    .await;
    agent.stop().await.expect("SIGTERM exits 0");
    // Both proved their content (a minute Ready each, what `known_good::track` records).
    let proof = |pod: &str| {
        let manifest: Value = serde_json::from_str(&world.read(&inactive(pod))).expect("JSON");
        let hash = manifest["metadata"]["annotations"]["checkpointer.alpha.coreos.com/spec-hash"].clone();
        json!({"namespace": NS, "name": pod, "spec_hash": hash, "since": 0})
    };
    world.write_journal(json!({"absent_since": [], "known_good": [proof(APISERVER), proof(NEW)]}));

    // The power cut: no API server, no parents; the newest known-good revision starts.
    world.api.set_outage(Reply::Refuse);
    world.kill(APISERVER);
    world.cri.remove_pod(NS, NEW);
    let agent = world.start_agent(AGENT, &args);
    eventually("the newest known-good revision active", || async {
        world.path(&active(NEW)).exists()
    })
    .await;
    assert!(
        !world.path(&active(APISERVER)).exists(),
        "one revision active at a time"
    );
    // The kubelet runs it; it crashes, and restarts.
    world
        .cri
        .add_pod(NS, &new_static, proto::SANDBOX_READY, &[proto::CONTAINER_EXITED]);
    world.looked_twice("the first restart count seen").await;
    for attempt in 1..=2 {
        world.cri.set_attempts(NS, &new_static, &[attempt]);
        world.looked_twice("a restart").await;
        assert!(world.path(&active(NEW)).exists(), "{attempt} restarts: not yet");
    }
    world.cri.set_attempts(NS, &new_static, &[3]);
    eventually("the previous known-good revision replacing it", || async {
        world.path(&active(APISERVER)).exists() && !world.path(&active(NEW)).exists()
    })
    .await;
    world.cri.remove_pod(NS, &new_static);
    agent.expect_count("revisions_set_aside_total", 1.0).await;
    // Once: it stays so while the outage lasts.
    world.looked_twice("after the replacement").await;
    assert!(world.path(&active(APISERVER)).exists() && !world.path(&active(NEW)).exists());
    let journal: Value = serde_json::from_str(&world.read(JOURNAL)).expect("the journal");
    let proven: Vec<&str> = (journal["state"]["known_good"]
        .as_array()
        .expect("known_good")
        .iter())
    .filter_map(|k| k["name"].as_str())
    .collect();
    // Was: its mark dropped. Issue 36: suspended, not dropped (restarts alone never
    // take a mark for good).
    assert_eq!(proven, [APISERVER, NEW], "both marks kept");
    let suspended: Vec<&str> = (journal["state"]["suspended"].as_array())
        .expect("suspended")
        .iter()
        .filter_map(|k| k["name"].as_str())
        .collect();
    assert_eq!(suspended, [NEW], "the set-aside revision's mark is suspended");
    // Back through the replacement, the API gets the Event on the set-aside revision's pod.
    world.api.end_outage();
    eventually(
        "the RevisionCrashLooping Event on the set-aside revision",
        || async {
            (world.api.event_writes().into_iter())
                .any(|(_, e)| e["regarding"]["name"] == NEW && e["reason"] == "RevisionCrashLooping")
        },
    )
    .await;
    // The replacement brought the API back: the set-aside holds, the suspended mark goes.
    eventually("the suspended mark gone for good", || async {
        let journal: Value = serde_json::from_str(&world.read(JOURNAL)).expect("the journal");
        let marks = |key: &str| -> Vec<String> {
            (journal["state"][key].as_array().into_iter().flatten())
                .filter_map(|k| k["name"].as_str().map(str::to_owned))
                .collect()
        };
        marks("known_good") == [APISERVER] && marks("suspended").is_empty()
    })
    .await;
    agent.stop().await.expect("SIGTERM exits 0");
}

/// Issue 36: a journal that cannot be used (torn, garbage, a read failing with EIO) was
/// read as a new node's: the known-good and rejected marks silently gone, and the next
/// save wrote over it. It is set aside now, as unusable manifests are, kept byte for byte
/// in the quarantine dir; it is counted, and the marks count as unknown until a synced
/// pass (the gauge says so meanwhile).
#[tokio::test]
async fn an_unusable_journal_is_kept_aside_and_its_marks_count_as_unknown() {
    use ckpt_store::failpoint::{self, Action};

    let quarantined = |world: &World| -> Vec<Vec<u8>> {
        let dir = world.path("ck/checkpoint-quarantine");
        let mut found: Vec<_> = (std::fs::read_dir(dir).into_iter().flatten().flatten())
            .filter(|e| e.file_name().to_string_lossy().starts_with("state.json."))
            .map(|e| std::fs::read(e.path()).expect("a quarantined journal reads"))
            .collect();
        found.sort();
        found
    };
    let world = World::new(Local::Cri, &[APISERVER, AGENT]).await;
    let agent = world.start_agent(AGENT, &[]);
    world.expect_files("checkpointed", &checkpointed(AGENT)).await;
    agent.stop().await.expect("SIGTERM exits 0");

    // A torn journal, read in an outage: set aside; nothing proves anything, so the marks
    // stay unknown.
    let torn = br#"{"version":1,"state":{"absent_since":[],"known_good":[{"namespace":"#;
    world.write_journal(json!({}));
    std::fs::write(world.path(JOURNAL), torn).expect("torn journal");
    world.api.set_outage(Reply::Refuse);
    let agent = world.start_agent(AGENT, &[]);
    agent.expect_api("unreachable").await;
    agent.expect_count("journal_unusable_total", 1.0).await;
    agent.expect_count("revision_marks_unknown", 1.0).await;
    assert_eq!(quarantined(&world), [torn.to_vec()], "kept as it was");
    // Back: a synced pass makes them known again, and the journal is saved afresh.
    world.api.end_outage();
    agent.expect_api("synced").await;
    eventually("the marks known again", || async {
        agent.metric("revision_marks_unknown").await == 0.0
    })
    .await;
    eventually("a journal saved afresh", || async {
        std::fs::read(world.path(JOURNAL)).is_ok_and(|b| b.starts_with(br#"{"version":1,"state":"#))
    })
    .await;
    assert_eq!(quarantined(&world), [torn.to_vec()], "not written over");
    agent.stop().await.expect("SIGTERM exits 0");

    // A journal whose read fails (EIO): set aside too, never written over.
    let saved = std::fs::read(world.path(JOURNAL)).expect("the saved journal");
    failpoint::set("fsops.read", &world.path(JOURNAL), Action::Error(5));
    let agent = world.start_agent(AGENT, &[]);
    agent.expect_api("synced").await;
    agent.expect_count("journal_unusable_total", 1.0).await;
    failpoint::clear("fsops.read", &world.path(JOURNAL));
    let mut expected = vec![torn.to_vec(), saved];
    expected.sort();
    assert_eq!(quarantined(&world), expected, "both kept as they were");
    agent.stop().await.expect("SIGTERM exits 0");
}
