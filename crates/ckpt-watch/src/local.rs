//! What runs on this node: the CRI runtime and the kubelet, reduced to a [`LocalView`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use ckpt_core::{LocalView, NamespaceAllowList, PodId, is_parent};
use k8s_openapi::api::core::v1::Pod;
use tracing::{debug, info, warn};

use crate::cri::CriClient;
use crate::error::Error;
use crate::kubelet::KubeletClient;

/// Logs a source's failure once per change from healthy to failing, and its recovery.
#[derive(Debug, Default)]
struct SourceHealth {
    failing: AtomicBool,
}

impl SourceHealth {
    fn failed(&self, source: &str, err: &Error) {
        if self.failing.swap(true, Ordering::Relaxed) {
            debug!(source, problem = %err.chain(), "local source still failing");
        } else {
            warn!(source, problem = %err.chain(), "local source failed");
        }
    }

    fn ok(&self, source: &str) {
        if self.failing.swap(false, Ordering::Relaxed) {
            info!(source, "local source answers again");
        }
    }
}

/// Combines the CRI runtime and the kubelet into the planner's [`LocalView`].
///
/// - **CRI on**: `running` = the runtime's running pods (a running container; a ready
///   sandbox alone does not count, see [`CriClient::running_pods`]) in the allowed namespaces,
///   `containers` their running containers' ids; `kubelet_parents` = the parents in the
///   kubelet's `/pods`. If the runtime fails, the view is [`LocalView::Unknown`]. If only
///   the kubelet fails, `running` is still known and `kubelet_parents` is empty
///   (it is informational only).
/// - **CRI off** (`cri: None`): all come from the kubelet; a pod runs when its phase is
///   `Running` and every container is running, and its containers' ids are those its
///   status there names. If the kubelet fails, the view is
///   [`LocalView::Unknown`].
/// - Neither source configured: always [`LocalView::Unknown`].
///
/// A failing source is never read as "nothing is running". Failures are logged once per
/// change of state, not on every call.
#[derive(Debug)]
pub struct LocalObserver {
    cri: Option<CriClient>,
    kubelet: Option<KubeletClient>,
    namespaces: NamespaceAllowList,
    cri_health: SourceHealth,
    kubelet_health: SourceHealth,
    cri_answers_too_large: AtomicU64,
    /// How long one [`LocalObserver::observe`] may take, all calls together.
    bound: Duration,
    /// The checkpoints whose static pods' restart counts are asked for, each with its
    /// static pod's name (see [`LocalObserver::watch_restarts`]).
    restart_watch: Mutex<BTreeMap<PodId, String>>,
    /// Namespaces outside the allow-list whose running pods are reported too (see
    /// [`LocalObserver::observe_outside`]).
    outside: Mutex<BTreeSet<String>>,
}

/// The default bound of one local look: a runtime that takes longer to say what runs
/// counts as unknown, so an outage activates checkpoints after one bound at most, not
/// after a timeout per call in a row.
pub const LOCAL_LOOK_BOUND: Duration = Duration::from_secs(5);

impl LocalObserver {
    /// An observer of these sources, for pods in these namespaces.
    pub fn new(
        cri: Option<CriClient>,
        kubelet: Option<KubeletClient>,
        namespaces: NamespaceAllowList,
    ) -> Self {
        Self {
            cri,
            kubelet,
            namespaces,
            cri_health: SourceHealth::default(),
            kubelet_health: SourceHealth::default(),
            cri_answers_too_large: Default::default(),
            bound: LOCAL_LOOK_BOUND,
            restart_watch: Mutex::default(),
            outside: Mutex::default(),
        }
    }

    /// From now on, each look also says which pods run in these namespaces outside the
    /// allow-list (in `running` only: nothing there is a parent). They are those of active
    /// checkpoints whose namespace was removed from `--namespaces`
    /// (`ckpt_core::local_namespaces_outside`), retired once their parents are seen
    /// running. One more runtime call per namespace a look, none while the set is empty.
    pub fn observe_outside(&self, namespaces: BTreeSet<String>) {
        let mut outside = self.outside.lock().unwrap_or_else(PoisonError::into_inner);
        if *outside != namespaces {
            debug!(?namespaces, "namespaces outside the allow-list observed");
            *outside = namespaces;
        }
    }

    /// Whether pods of `namespace` are reported as running: allowed, or observed outside.
    fn observed(&self, outside: &BTreeSet<String>, namespace: &str) -> bool {
        self.namespaces.allows(namespace) || outside.contains(namespace)
    }

    /// From now on, each look also asks for the restart counts of these checkpoints'
    /// static pods (each checkpoint with the name the kubelet runs it under,
    /// [`PodId::static_pod_name`]): one more runtime call per pod, none while the set is
    /// empty (an idle node). They are the view's `restarts`.
    pub fn watch_restarts(&self, pods: impl IntoIterator<Item = (PodId, String)>) {
        let pods: BTreeMap<PodId, String> = pods.into_iter().collect();
        let mut watched = self.restart_watch.lock().unwrap_or_else(PoisonError::into_inner);
        if *watched != pods {
            debug!(pods = pods.len(), "restart counts watched");
            *watched = pods;
        }
    }

    fn watched(&self) -> BTreeMap<PodId, String> {
        (self.restart_watch.lock())
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The same, with another bound on one whole look (see [`LOCAL_LOOK_BOUND`]).
    pub fn with_bound(mut self, bound: Duration) -> Self {
        self.bound = bound;
        self
    }

    /// The CRI client, if configured.
    pub fn cri(&self) -> Option<&CriClient> {
        self.cri.as_ref()
    }

    /// The kubelet client, if configured.
    pub fn kubelet(&self) -> Option<&KubeletClient> {
        self.kubelet.as_ref()
    }

    /// How many runtime answers were refused for their size (each leaves the local view
    /// unknown for that pass).
    pub fn cri_answers_too_large(&self) -> u64 {
        self.cri_answers_too_large.load(Ordering::Relaxed)
    }

    /// `look` at a source, or an error once the bound of a whole look has passed.
    async fn bounded<T>(
        &self,
        source_name: &'static str,
        look: impl Future<Output = crate::error::Result<T>>,
    ) -> crate::error::Result<T> {
        tokio::time::timeout(self.bound, look)
            .await
            .unwrap_or(Err(Error::LocalLookTimedOut {
                source_name,
                bound: self.bound,
            }))
    }

    /// Asks the sources (concurrently; each call is bounded by its client's timeout, and
    /// each source's whole look by the observer's bound).
    pub async fn observe(&self) -> LocalView {
        let watched = self.watched();
        let outside = (self.outside.lock())
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let cri = async {
            match &self.cri {
                Some(cri) => {
                    let look = async {
                        // Collected: an iterator borrowing `outside` held across the
                        // await would make the future's `Send` depend on its lifetimes.
                        let namespaces: Vec<&str> = (self.namespaces.namespaces())
                            .chain(outside.iter().map(|ns| ns.as_str()))
                            .collect();
                        let running = cri.running_pods(namespaces).await?;
                        let mut restarts = BTreeMap::new();
                        if !watched.is_empty() {
                            let pods: Vec<(String, String)> = (watched.iter())
                                .map(|(id, name)| (id.namespace.to_string(), name.clone()))
                                .collect();
                            let counts = cri.restarts(&pods).await?;
                            for (id, name) in &watched {
                                if let Some(n) = counts.get(&(id.namespace.to_string(), name.clone())) {
                                    restarts.insert(id.clone(), *n);
                                }
                            }
                        }
                        Ok((running, restarts))
                    };
                    Some(self.bounded("CRI runtime", look).await)
                }
                None => None,
            }
        };
        let kubelet = async {
            match &self.kubelet {
                Some(k) => Some(self.bounded("kubelet", k.pods()).await),
                None => None,
            }
        };
        let (cri, kubelet) = futures::join!(cri, kubelet);
        let kubelet_pods = match kubelet {
            Some(Ok(pods)) => {
                self.kubelet_health.ok("kubelet");
                Some(pods)
            }
            Some(Err(e)) => {
                self.kubelet_health.failed("kubelet", &e);
                None
            }
            None => None,
        };
        let kubelet_parents = |pods: &[Pod]| -> BTreeSet<PodId> {
            pods.iter()
                .filter(|p| is_parent(p, &self.namespaces))
                .filter_map(PodId::of)
                .collect()
        };
        match cri {
            Some(Ok((running, restarts))) => {
                self.cri_health.ok("CRI");
                let containers: BTreeMap<PodId, BTreeSet<String>> = (running.into_iter())
                    .filter(|(id, _)| self.observed(&outside, &id.namespace))
                    .collect();
                LocalView::Known {
                    running: containers.keys().cloned().collect(),
                    containers,
                    kubelet_parents: kubelet_pods.as_deref().map(kubelet_parents).unwrap_or_default(),
                    restarts,
                }
            }
            Some(Err(e)) => {
                if matches!(e, Error::Cri(ckpt_cri::Error::AnswerTooLarge { .. })) {
                    self.cri_answers_too_large.fetch_add(1, Ordering::Relaxed);
                }
                self.cri_health.failed("CRI", &e);
                LocalView::Unknown
            }
            None => match kubelet_pods {
                Some(pods) => {
                    let containers: BTreeMap<PodId, BTreeSet<String>> = (pods.iter())
                        .filter(|p| runs(p))
                        .filter_map(|p| Some((PodId::of(p)?, running_containers(p))))
                        .filter(|(id, _)| self.observed(&outside, &id.namespace))
                        .collect();
                    LocalView::Known {
                        running: containers.keys().cloned().collect(),
                        containers,
                        kubelet_parents: kubelet_parents(&pods),
                        restarts: kubelet_restarts(&pods, &watched),
                    }
                }
                None => LocalView::Unknown,
            },
        }
    }
}

/// With the CRI off: the ids of a pod's running containers, from its status in the
/// kubelet's `/pods` (the kubelet's own, current view).
fn running_containers(pod: &Pod) -> BTreeSet<String> {
    let statuses = (pod.status.as_ref()).and_then(|s| s.container_statuses.as_deref());
    (statuses.unwrap_or_default().iter())
        .filter(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        .filter_map(|c| c.container_id.as_deref())
        .map(|id| ckpt_core::runtime_id(id).to_owned())
        .collect()
}

/// With the CRI off: the restart counts of the watched checkpoints' static pods, from
/// their statuses in the kubelet's `/pods` (the kubelet fills a static pod's in from its
/// own status manager, API server or not): the highest `restartCount` among its
/// containers, init containers included.
fn kubelet_restarts(pods: &[Pod], watched: &BTreeMap<PodId, String>) -> BTreeMap<PodId, u32> {
    let by_name: BTreeMap<(&str, &str), &PodId> = (watched.iter())
        .map(|(id, name)| ((&*id.namespace, name.as_str()), id))
        .collect();
    let mut restarts = BTreeMap::new();
    for pod in pods {
        let Some(static_id) = PodId::of(pod) else {
            continue;
        };
        let Some(id) = by_name.get(&(&*static_id.namespace, &*static_id.name)) else {
            continue;
        };
        let status = pod.status.as_ref();
        let statuses = (status
            .and_then(|s| s.container_statuses.as_deref())
            .unwrap_or_default()
            .iter())
        .chain(
            status
                .and_then(|s| s.init_container_statuses.as_deref())
                .unwrap_or_default(),
        );
        if let Some(highest) = statuses
            .map(|c| u32::try_from(c.restart_count).unwrap_or(0))
            .max()
        {
            restarts.insert((*id).clone(), highest);
        }
    }
    restarts
}

/// With the CRI off: phase `Running` and every container (as many statuses as the spec
/// has containers) running.
pub fn runs(pod: &Pod) -> bool {
    let Some(status) = &pod.status else {
        return false;
    };
    if status.phase.as_deref() != Some("Running") {
        return false;
    }
    let statuses = status.container_statuses.as_deref().unwrap_or_default();
    let wanted = pod.spec.as_ref().map_or(0, |s| s.containers.len());
    !statuses.is_empty()
        && statuses.len() >= wanted
        && statuses
            .iter()
            .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ckpt_core::ANNOTATION_CHECKPOINT;
    use serde_json::{Value, json};

    use super::*;
    use crate::cri::proto;
    use crate::kubelet::KubeletConfig;
    use crate::reflect::lock;
    use crate::testkit::{FakeCri, FakeKubelet};

    const T: Duration = Duration::from_secs(2);

    fn kubelet_pod(ns: &str, name: &str, parent: bool, phase: &str, running: &[bool]) -> Value {
        let annotations = if parent {
            json!({ANNOTATION_CHECKPOINT: "true"})
        } else {
            json!({})
        };
        let containers: Vec<Value> = (0..running.len())
            .map(|i| json!({"name": format!("c{i}")}))
            .collect();
        let statuses: Vec<Value> = running
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let state = if *r {
                    json!({"running": {}})
                } else {
                    json!({"waiting": {"reason": "CrashLoopBackOff"}})
                };
                json!({"name": format!("c{i}"), "ready": r, "restartCount": 0, "image": "i", "imageID": "",
                       "containerID": format!("containerd://{name}-c{i}"), "state": state})
            })
            .collect();
        json!({"metadata": {"name": name, "namespace": ns, "annotations": annotations},
               "spec": {"containers": containers},
               "status": {"phase": phase, "containerStatuses": statuses}})
    }

    /// The running container of the fake runtime's pod `kube-system/api`, by its id.
    fn api_container() -> BTreeMap<PodId, BTreeSet<String>> {
        BTreeMap::from([(
            PodId::new("kube-system", "api"),
            BTreeSet::from(["ctr-kube-system-api-0".to_owned()]),
        )])
    }

    async fn kubelet(pods: Vec<Value>) -> (FakeKubelet, KubeletClient) {
        let fake = FakeKubelet::start(false).await;
        lock(&fake.state).pods = pods;
        let client = KubeletClient::new(KubeletConfig {
            url: fake.url.clone(),
            readonly_url: None,
            token_file: None,
            ca_file: None,
            insecure_skip_tls_verify: false,
            timeout: T,
        })
        .unwrap();
        (fake, client)
    }

    fn allowed() -> NamespaceAllowList {
        NamespaceAllowList::new(["kube-system"])
    }

    fn ids(names: &[&str]) -> BTreeSet<PodId> {
        names.iter().map(|n| PodId::new("kube-system", *n)).collect()
    }

    /// The restart counts of the watched static pods: from the runtime (the highest attempt,
    /// exited containers included), else from the kubelet's `/pods`; nothing is asked while
    /// nothing is watched.
    #[tokio::test]
    async fn restarts_of_watched_static_pods() {
        let cri = FakeCri::start(true, false);
        let state = [proto::CONTAINER_EXITED, proto::CONTAINER_RUNNING];
        cri.add_pod("kube-system", "api-1-node-1", proto::SANDBOX_READY, &state);
        cri.set_attempts("kube-system", "api-1-node-1", &[4, 1]);
        cri.add_pod(
            "kube-system",
            "other-node-1",
            proto::SANDBOX_READY,
            &[proto::CONTAINER_EXITED],
        );
        cri.set_attempts("kube-system", "other-node-1", &[9]);
        let observer = LocalObserver::new(Some(CriClient::new(&cri.endpoint(), T).unwrap()), None, allowed());
        let restarts = |view: LocalView| match view {
            LocalView::Known { restarts, .. } => restarts,
            LocalView::Unknown => panic!("unknown"),
        };
        let counts = |entries: &[(&str, u32)]| -> BTreeMap<PodId, u32> {
            (entries.iter())
                .map(|(n, c)| (PodId::new("kube-system", *n), *c))
                .collect()
        };
        assert_eq!(restarts(observer.observe().await), counts(&[]));
        assert_eq!(cri.calls().len(), 2, "version and one list: {:?}", cri.calls());
        let watched = |names: &[&str]| -> Vec<(PodId, String)> {
            (names.iter())
                .map(|n| (PodId::new("kube-system", *n), format!("{n}-node-1")))
                .collect()
        };
        observer.watch_restarts(watched(&["api-1", "gone"]));
        assert_eq!(restarts(observer.observe().await), counts(&[("api-1", 4)]));
        assert_eq!(
            cri.calls().len(),
            5,
            "one list per watched pod more: {:?}",
            cri.calls()
        );
        observer.watch_restarts(watched(&[]));
        observer.observe().await;
        assert_eq!(cri.calls().len(), 6);

        // With the CRI off, from the static pods' statuses in the kubelet's `/pods`.
        let mut api = kubelet_pod("kube-system", "api-1-node-1", false, "Running", &[true]);
        api["status"]["containerStatuses"][0]["restartCount"] = 3.into();
        api["status"]["initContainerStatuses"] = serde_json::json!([{"name": "init", "ready": true,
            "restartCount": 5, "image": "i", "imageID": "", "state": {"terminated": {"exitCode": 0}}}]);
        let mut other = kubelet_pod("kube-system", "other-node-1", false, "Running", &[true]);
        other["status"]["containerStatuses"][0]["restartCount"] = 9.into();
        let (_k, kubelet) = kubelet(vec![api, other]).await;
        let observer = LocalObserver::new(None, Some(kubelet), allowed());
        assert_eq!(restarts(observer.observe().await), counts(&[]));
        observer.watch_restarts(watched(&["api-1"]));
        assert_eq!(restarts(observer.observe().await), counts(&[("api-1", 5)]));
    }

    /// Namespaces outside the allow-list are looked at only once asked for (a namespace
    /// removed from `--namespaces` with active checkpoints), and only for what runs: no
    /// pod there is a parent. Both with the CRI and with the kubelet.
    #[tokio::test]
    async fn namespaces_outside_the_allow_list_report_running_pods_once_asked_for() {
        let running = |view: LocalView| match view {
            LocalView::Known {
                running,
                kubelet_parents,
                ..
            } => (running, kubelet_parents),
            LocalView::Unknown => panic!("unknown"),
        };
        let cri = FakeCri::start(true, false);
        let up = [proto::CONTAINER_RUNNING];
        cri.add_pod("kube-system", "api", proto::SANDBOX_READY, &up);
        cri.add_pod("cni", "flannel", proto::SANDBOX_READY, &up);
        cri.add_pod("other", "unrelated", proto::SANDBOX_READY, &up);
        let (_k, kubelet) = kubelet(vec![
            kubelet_pod("kube-system", "api", true, "Running", &[true]),
            kubelet_pod("cni", "flannel", true, "Running", &[true]),
            kubelet_pod("other", "unrelated", true, "Running", &[true]),
        ])
        .await;
        let with_cri = LocalObserver::new(Some(CriClient::new(&cri.endpoint(), T).unwrap()), None, allowed());
        let with_kubelet = LocalObserver::new(None, Some(kubelet), allowed());
        let cni = PodId::new("cni", "flannel");
        for observer in [with_cri, with_kubelet] {
            let mode = if observer.cri().is_some() {
                "CRI"
            } else {
                "kubelet"
            };
            assert_eq!(running(observer.observe().await).0, ids(&["api"]), "{mode}");
            observer.observe_outside(BTreeSet::from(["cni".to_owned()]));
            let (seen, parents) = running(observer.observe().await);
            let expected: BTreeSet<PodId> = ids(&["api"]).into_iter().chain([cni.clone()]).collect();
            assert_eq!(seen, expected, "{mode}");
            assert!(!parents.contains(&cni), "{mode}: never a parent");
            observer.observe_outside(BTreeSet::new());
            assert_eq!(running(observer.observe().await).0, ids(&["api"]), "{mode}");
        }
    }

    #[tokio::test]
    async fn cri_decides_running_and_the_kubelet_names_parents() {
        let cri = FakeCri::start(true, false);
        cri.add_pod(
            "kube-system",
            "api",
            proto::SANDBOX_READY,
            &[proto::CONTAINER_RUNNING],
        );
        cri.add_pod(
            "kube-system",
            "dead",
            proto::SANDBOX_NOTREADY,
            &[proto::CONTAINER_EXITED],
        );
        cri.add_pod("default", "elsewhere", proto::SANDBOX_READY, &[]);
        let (_k, kubelet) = kubelet(vec![
            kubelet_pod("kube-system", "api", true, "Running", &[true]),
            kubelet_pod("kube-system", "dead", true, "Failed", &[false]),
            kubelet_pod("kube-system", "plain", false, "Running", &[true]),
            kubelet_pod("default", "elsewhere", true, "Running", &[true]),
        ])
        .await;
        let observer = LocalObserver::new(
            Some(CriClient::new(&cri.endpoint(), T).unwrap()),
            Some(kubelet),
            allowed(),
        );
        assert_eq!(
            observer.observe().await,
            LocalView::Known {
                running: ids(&["api"]),
                containers: api_container(),
                kubelet_parents: ids(&["api", "dead"]),
                restarts: BTreeMap::new(),
            }
        );

        // The kubelet fails: running is still known, the kubelet's parents are empty.
        lock(&_k.state).status = 500;
        assert_eq!(
            observer.observe().await,
            LocalView::Known {
                running: ids(&["api"]),
                containers: api_container(),
                kubelet_parents: BTreeSet::new(),
                restarts: BTreeMap::new(),
            }
        );

        // The runtime fails: unknown, never "nothing runs".
        cri.stop();
        assert_eq!(observer.observe().await, LocalView::Unknown);
    }

    #[tokio::test]
    async fn without_cri_the_kubelet_status_decides() {
        let (fake, kubelet) = kubelet(vec![
            kubelet_pod("kube-system", "all-running", true, "Running", &[true, true]),
            kubelet_pod("kube-system", "one-crashing", true, "Running", &[true, false]),
            kubelet_pod("kube-system", "pending", false, "Pending", &[false]),
            kubelet_pod("default", "other-ns", true, "Running", &[true]),
        ])
        .await;
        let observer = LocalObserver::new(None, Some(kubelet), allowed());
        assert_eq!(
            observer.observe().await,
            LocalView::Known {
                running: ids(&["all-running"]),
                // The ids the kubelet's status names, without the runtime's scheme.
                containers: BTreeMap::from([(
                    PodId::new("kube-system", "all-running"),
                    BTreeSet::from(["all-running-c0".to_owned(), "all-running-c1".to_owned()]),
                )]),
                kubelet_parents: ids(&["all-running", "one-crashing"]),
                restarts: BTreeMap::new(),
            }
        );
        lock(&fake.state).status = 403;
        assert_eq!(observer.observe().await, LocalView::Unknown);
        assert_eq!(
            LocalObserver::new(None, None, allowed()).observe().await,
            LocalView::Unknown
        );
    }

    #[test]
    fn runs_needs_every_container_running() {
        let pod = |v: Value| serde_json::from_value::<Pod>(v).unwrap();
        assert!(runs(&pod(kubelet_pod("a", "b", false, "Running", &[true]))));
        assert!(!runs(&pod(kubelet_pod(
            "a",
            "b",
            false,
            "Running",
            &[true, false]
        ))));
        assert!(!runs(&pod(kubelet_pod("a", "b", false, "Succeeded", &[true]))));
        // Fewer statuses than containers: not all running yet.
        let mut missing = kubelet_pod("a", "b", false, "Running", &[true]);
        missing["spec"]["containers"] = json!([{"name": "c0"}, {"name": "c1"}]);
        assert!(!runs(&pod(missing)));
        assert!(!runs(&Pod::default()));
    }

    /// A runtime that answers each call just within the client's timeout (0.8 s of 1 s),
    /// asked about three namespaces: call after call would take 0.8 s × 7 (the version,
    /// then sandboxes and containers per namespace). The whole look is bounded (1 s here):
    /// the view is unknown after the bound, as an outage needs it to be soon.
    #[tokio::test]
    async fn a_slow_runtime_makes_one_look_last_its_bound_not_a_timeout_per_call() {
        let cri = FakeCri::start(true, false);
        lock(&cri.state).delay = Some(Duration::from_millis(800));
        let client = CriClient::new(&cri.endpoint(), Duration::from_secs(1)).unwrap();
        let observer = LocalObserver::new(Some(client), None, NamespaceAllowList::new(["a", "b", "c"]))
            .with_bound(Duration::from_secs(1));
        let started = std::time::Instant::now();
        assert_eq!(observer.observe().await, LocalView::Unknown);
        let took = started.elapsed();
        assert!(took < Duration::from_secs(3), "one look took {took:?}");
    }

    /// A misbehaving runtime, fault by fault: every look ends within its bound as
    /// "unknown" (never "nothing runs"), the next look after the fault clears sees what
    /// runs again without a restart, and no look leaves connections behind.
    #[tokio::test]
    async fn a_misbehaving_runtime_is_unknown_within_the_bound_and_recovers() {
        use crate::testkit::CriFault;

        let bound = Duration::from_secs(1);
        // (what, the fault, or a delay past the client's timeout)
        let faults = [
            ("hangs", Some(CriFault::Hang), None),
            ("resets the stream", Some(CriFault::Reset), None),
            (
                "answers Unimplemented to the lists",
                Some(CriFault::Unimplemented),
                None,
            ),
            ("answers Internal", Some(CriFault::Internal), None),
            (
                "answers past the client's timeout",
                None,
                Some(Duration::from_secs(3)),
            ),
        ];
        for (what, fault, delay) in faults {
            let cri = FakeCri::start(true, false);
            cri.add_pod(
                "kube-system",
                "api",
                proto::SANDBOX_READY,
                &[proto::CONTAINER_RUNNING],
            );
            let client = CriClient::new(&cri.endpoint(), Duration::from_millis(500)).unwrap();
            let observer = LocalObserver::new(Some(client), None, allowed()).with_bound(bound);
            let running = LocalView::Known {
                running: ids(&["api"]),
                containers: api_container(),
                kubelet_parents: BTreeSet::new(),
                restarts: BTreeMap::new(),
            };
            assert_eq!(observer.observe().await, running, "{what}: before");
            {
                let mut state = lock(&cri.state);
                state.fault = fault;
                state.delay = delay;
            }
            for look in 0..3 {
                let started = std::time::Instant::now();
                assert_eq!(
                    observer.observe().await,
                    LocalView::Unknown,
                    "{what}: look {look}"
                );
                // The bound, with room for a loaded machine.
                let took = started.elapsed();
                assert!(took < bound * 3, "{what}: look {look} took {took:?}");
            }
            {
                let mut state = lock(&cri.state);
                state.fault = None;
                state.delay = None;
            }
            let recovered = crate::testkit::within(10, "the runtime's answer again", async {
                loop {
                    if observer.observe().await == running {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            });
            recovered.await;
            let accepted = lock(&cri.state).accepted;
            assert!(accepted <= 5, "{what}: {accepted} connections for 5 looks");
        }
    }
}
