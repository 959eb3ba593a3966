//! [`Observer`]: the API server's pods, the objects they mount and the owners of orphan
//! candidates, gathered into one [`Observation`] per pass.

use std::collections::BTreeMap;
use std::time::Duration;

use ckpt_core::{
    ControllerOwner, DiskCheckpoint, Fetched, KubeletVersion, LocalView, NamespaceAllowList, Observation,
    OwnerStatus, PodId, SelfIdentity, daemon_set_lookups, orphan_owners, required_by_namespace,
};
use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::api::{ApiSnapshot, ApiState, ApiWatch, ApiWatchConfig};
use crate::error::error_chain;
use crate::objects::ObjectWatch;
use crate::owner::{OwnerLookup, OwnerPresence};

/// Owner lookups in flight at once, at most.
const CONCURRENT_LOOKUPS: usize = 8;
/// How often this node's kubelet version is read again from its Node (a kubelet upgrade
/// changes it); a failed read is retried after [`KUBELET_VERSION_RETRY`]. Hourly: a stale
/// version errs on the strict side (newer kubelets know more fields and accept more env
/// names; what the ≥1.34 rule refuses, sanitization never writes), and an idle agent makes
/// no request besides its watches and probes for an hour at a time.
const KUBELET_VERSION_EVERY: Duration = Duration::from_secs(3600);
const KUBELET_VERSION_RETRY: Duration = Duration::from_secs(60);

/// Everything the agent watches on the API server: the pods of this node
/// ([`ApiWatch`]), the Secrets and ConfigMaps the parents among them mount
/// ([`ObjectWatch`], kept in step with the pods by the observer itself) and, on demand,
/// whether the controller owners of orphan candidates exist ([`OwnerLookup`]).
///
/// Every change bumps the counter of [`Observer::subscribe`]: await it, then
/// [`Observer::observe`].
pub struct Observer {
    api: ApiWatch,
    objects: ObjectWatch,
    owners: OwnerLookup,
    allowed: NamespaceAllowList,
    client: kube::Client,
    node: String,
    request_timeout: Duration,
    kubelet: std::sync::Mutex<KubeletVersionRead>,
}

/// The kubelet version last read from the Node, and when to read it again.
#[derive(Debug, Default)]
struct KubeletVersionRead {
    version: Option<KubeletVersion>,
    next: Option<Instant>,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer")
            .field("api", &self.api)
            .field("objects", &self.objects)
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl Observer {
    /// Starts the pod watches and the probe; object watches start as parents need them.
    /// Owner lookups are bounded by `request_timeout` each.
    ///
    /// # Panics
    /// Outside a Tokio runtime (it spawns tasks).
    pub fn spawn(client: kube::Client, config: ApiWatchConfig, request_timeout: Duration) -> Self {
        let allowed = config.namespaces.clone();
        let node = config.node.clone();
        let api = ApiWatch::spawn(client.clone(), config);
        Self {
            objects: ObjectWatch::new(client.clone(), api.notifier())
                .with_relists(api.relists())
                .with_gate(api.gate()),
            owners: OwnerLookup::new(client.clone(), request_timeout),
            api,
            allowed,
            client,
            node,
            request_timeout,
            kubelet: Default::default(),
        }
    }

    /// A counter bumped on every pod or object event and every change of the API state.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.api.subscribe()
    }

    /// Sets the API probe's pace: fast while a change of the API server matters on this
    /// node (see [`ApiWatch::set_at_stake`]).
    pub fn set_at_stake(&self, at_stake: bool) {
        self.api.set_at_stake(at_stake);
    }

    /// The pod watch's current view, with its bookkeeping (sync time, outages, per-namespace
    /// errors).
    pub fn snapshot(&self) -> ApiSnapshot {
        self.api.snapshot()
    }

    /// One observation. On a synced view the object watches are first made to cover
    /// exactly what the parents need; with `owner_status`, the controller owners of the
    /// checkpoints in `disk` whose parents are absent are looked up (one `GET` each); the
    /// DaemonSets of such checkpoints, and the agent's own when it (`me`) has a checkpoint
    /// but no pod, are fetched with this node (`get` on both), to tell a rollout from a
    /// descheduling ([`daemon_set_lookups`]).
    pub async fn observe(
        &self,
        local: LocalView,
        disk: &BTreeMap<PodId, DiskCheckpoint>,
        owner_status: bool,
        me: &SelfIdentity,
    ) -> Observation {
        let snapshot = self.api.snapshot();
        let synced = snapshot.state == ApiState::Synced;
        if synced {
            self.objects
                .ensure_all(&required_by_namespace(&snapshot.pods, &self.allowed, me));
        }
        let objects = (self.allowed.namespaces())
            .map(|ns| (ns.to_owned(), self.objects.objects(ns)))
            .collect();
        // The lookups run side by side, a few at a time: one after another, a slow API
        // server would hold the pass for a request timeout per owner. DaemonSets are
        // fetched whole (whether they still target this node matters, whatever the
        // strategy); other owners only for whether they exist.
        let daemon_set_keys = daemon_set_lookups(snapshot.state, &snapshot.pods, disk, me, &self.allowed);
        let mut keys = if owner_status {
            orphan_owners(snapshot.state, &snapshot.pods, disk, &self.allowed)
        } else {
            Default::default()
        };
        keys.retain(|key| !daemon_set_keys.contains(key));
        let lookups = futures::stream::iter(keys)
            .map(|key| async move {
                let owner = ControllerOwner {
                    api_version: key.api_version.clone(),
                    kind: key.kind.clone(),
                    name: key.name.clone(),
                    uid: String::new(),
                };
                let status = match self.owners.owner_status(&key.namespace, &owner).await {
                    OwnerPresence::Present => OwnerStatus::Present,
                    OwnerPresence::Absent => OwnerStatus::Absent,
                    OwnerPresence::Unknown(reason) => {
                        debug!(owner = %owner.to_annotation(), %reason, "owner lookup failed");
                        OwnerStatus::Unknown
                    }
                };
                (key, status)
            })
            .buffer_unordered(CONCURRENT_LOOKUPS)
            .collect::<BTreeMap<_, _>>();
        let need_node = !daemon_set_keys.is_empty();
        let daemon_sets = futures::stream::iter(daemon_set_keys)
            .map(|key| async move {
                let daemon_sets = Api::<DaemonSet>::namespaced(self.client.clone(), &key.namespace);
                let what = format!("daemonset {}/{}", key.namespace, key.name);
                let fetched = self.fetch(&what, daemon_sets.get_opt(&key.name)).await;
                (key, fetched)
            })
            .buffer_unordered(CONCURRENT_LOOKUPS)
            .collect::<BTreeMap<_, _>>();
        let node = async {
            if need_node {
                self.fetch_node().await
            } else {
                Fetched::NotFetched
            }
        };
        let (mut owners, daemon_sets, node) = futures::join!(lookups, daemon_sets, node);
        if owner_status {
            // A DaemonSet fetched whole answers whether it exists too: no second GET.
            for (key, fetched) in &daemon_sets {
                let status = match fetched {
                    Fetched::Found(_) => OwnerStatus::Present,
                    Fetched::NotFound => OwnerStatus::Absent,
                    Fetched::NotFetched | Fetched::Failed(_) => OwnerStatus::Unknown,
                };
                owners.insert(key.clone(), status);
            }
        }
        // After the scheduling lookup: a Node it fetched is not fetched twice.
        let kubelet = self.kubelet_version(synced, &node).await;
        Observation {
            api: snapshot.state,
            api_error: snapshot.last_error,
            pods: snapshot.pods,
            unknown_fields: (snapshot.unknown_fields.into_iter())
                .map(|(id, fields)| (id, fields.to_vec()))
                .collect(),
            objects,
            local,
            owners,
            daemon_sets,
            node,
            kubelet,
        }
    }

    /// This node's kubelet version (`status.nodeInfo.kubeletVersion`), read on a synced
    /// view every [`KUBELET_VERSION_EVERY`] (from `fetched` when this pass has the Node
    /// already); the last one read meanwhile, `None` before the first read succeeded.
    async fn kubelet_version(&self, synced: bool, fetched: &Fetched<Node>) -> Option<KubeletVersion> {
        let (cached, due) = {
            let read = self
                .kubelet
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            (read.version, read.next.is_none_or(|next| Instant::now() >= next))
        };
        if !(synced && due) {
            return cached;
        }
        let what = format!("node {}", self.node);
        let node = match fetched {
            Fetched::Found(node) => Fetched::Found(node.clone()),
            _ => self.fetch_node().await,
        };
        let read = match node {
            Fetched::Found(node) => {
                let text = (node.status.as_ref())
                    .and_then(|s| s.node_info.as_ref())
                    .map(|i| i.kubelet_version.as_str())
                    .unwrap_or_default();
                text.parse::<KubeletVersion>().map_err(|e| format!("{what}: {e}"))
            }
            Fetched::NotFound => Err(format!("{what} not found")),
            Fetched::Failed(e) => Err(e),
            Fetched::NotFetched => Err(format!("{what} not fetched")),
        };
        let mut state = self
            .kubelet
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match read {
            Ok(version) => {
                if state.version != Some(version) {
                    debug!(kubelet = %version, "read this node's kubelet version");
                }
                state.version = Some(version);
                state.next = Some(Instant::now() + KUBELET_VERSION_EVERY);
            }
            Err(why) => {
                // Checkpoints are then admitted by the strictest rules (see ckpt_core::admit).
                warn!(error = %why, kept = ?state.version, "cannot read this node's kubelet version");
                state.next = Some(Instant::now() + KUBELET_VERSION_RETRY);
            }
        }
        state.version
    }

    /// This node's Node object, with the request timeout.
    async fn fetch_node(&self) -> Fetched<Node> {
        let nodes = Api::<Node>::all(self.client.clone());
        self.fetch(&format!("node {}", self.node), nodes.get_opt(&self.node))
            .await
    }

    /// One `GET` with the request timeout.
    async fn fetch<T>(&self, what: &str, get: impl Future<Output = kube::Result<Option<T>>>) -> Fetched<T> {
        match tokio::time::timeout(self.request_timeout, get).await {
            Err(_) => Fetched::Failed(format!("GET {what} timed out after {:?}", self.request_timeout)),
            Ok(Err(e)) => Fetched::Failed(format!("GET {what} failed: {}", error_chain(&e))),
            Ok(Ok(None)) => Fetched::NotFound,
            Ok(Ok(Some(object))) => Fetched::Found(std::sync::Arc::new(object)),
        }
    }
}
