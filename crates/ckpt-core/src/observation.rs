//! What the agent observed at the start of a pass, as one owned value: the input of
//! [`decide`](crate::decide()). `ckpt-watch` produces it; nothing here does I/O.
//!
//! Beside it, the rest of the planner's input model: the checkpoints on disk
//! ([`DiskCheckpoint`], from `ckpt-store`), what runs here ([`LocalView`]), the API view
//! the planner reads the observation as ([`ApiView`]), and whether the agent's own
//! DaemonSet still targets this node ([`SelfScheduling`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};

use crate::admission::KubeletVersion;
use crate::checkpoint::CheckpointMeta;
use crate::identity::{ControllerOwner, PodId};
use crate::references::RequiredObjects;
use crate::sanitize::ApiObjects;

/// How the API server is, in the three states the planner distinguishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ApiState {
    /// The health probe fails: down, refusing or hung. The only state that allows
    /// activating checkpoints.
    Unreachable,
    /// It answers, but there is no complete list of every namespace since the last
    /// outage or watch error (e.g. a 403 in one namespace). Neither activates nor
    /// garbage-collects. Also the state at start, before anything is known.
    Reachable,
    /// It answers, but rejects the agent's credentials (401: an expired or revoked token)
    /// or forbids the agent's own reads (403 on the pod list or watch of every allowed
    /// namespace: bindings gone, another identity). Treated as [`ApiState::Reachable`] by
    /// the planner; the agent hands its lock over when it lasts (ARCHITECTURE.md,
    /// Credentials).
    Unauthorized,
    /// Every namespace's pod list is complete and current. The only state that allows
    /// removing anything.
    Synced,
}

impl ApiState {
    /// Every state, in the order of [`ApiState::as_str`]'s names, for metrics.
    pub const ALL: [ApiState; 4] = [
        ApiState::Unreachable,
        ApiState::Reachable,
        ApiState::Unauthorized,
        ApiState::Synced,
    ];

    /// `unreachable`, `reachable`, `unauthorized` or `synced`, for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            ApiState::Unreachable => "unreachable",
            ApiState::Reachable => "reachable",
            ApiState::Unauthorized => "unauthorized",
            ApiState::Synced => "synced",
        }
    }
}

/// The kind of an object a pod mounts or reads env from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectKind {
    /// A `v1` Secret.
    Secret,
    /// A `v1` ConfigMap.
    ConfigMap,
}

impl ObjectKind {
    /// The resource name as in RBAC rules: `secrets`, `configmaps`.
    pub fn resource(self) -> &'static str {
        match self {
            ObjectKind::Secret => "secrets",
            ObjectKind::ConfigMap => "configmaps",
        }
    }
}

/// An object's kind and name (its namespace is implied by the view).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectRef {
    /// Secret or ConfigMap.
    pub kind: ObjectKind,
    /// The object's name.
    pub name: String,
}

impl ObjectRef {
    /// A secret reference.
    pub fn secret(name: impl Into<String>) -> Self {
        Self {
            kind: ObjectKind::Secret,
            name: name.into(),
        }
    }

    /// A configmap reference.
    pub fn config_map(name: impl Into<String>) -> Self {
        Self {
            kind: ObjectKind::ConfigMap,
            name: name.into(),
        }
    }

    /// Every object in `required`, secrets first, each sorted.
    pub fn all(required: &RequiredObjects) -> impl Iterator<Item = ObjectRef> + '_ {
        let secrets = required.secrets.iter().map(ObjectRef::secret);
        secrets.chain(required.config_maps.iter().map(ObjectRef::config_map))
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            ObjectKind::Secret => "secret",
            ObjectKind::ConfigMap => "configmap",
        };
        write!(f, "{kind} {}", self.name)
    }
}

/// What is known about the watched Secrets and ConfigMaps of one namespace.
#[derive(Clone, Debug, Default)]
pub struct ObjectsView {
    /// The objects that exist (their last known content; a watch that fails after a
    /// complete list keeps it while it relists).
    pub objects: ApiObjects,
    /// Objects known not to exist (a complete, empty list). Whether that is fine is the
    /// pod's business (`optional`), not an error here.
    pub absent: BTreeSet<ObjectRef>,
    /// Objects whose first list has not arrived yet.
    pub loading: BTreeSet<ObjectRef>,
    /// Objects never listed because the watch fails, with why (e.g. `forbidden: needs
    /// get/list/watch on secrets in namespace kube-system (…)`).
    pub failed: BTreeMap<ObjectRef, String>,
}

impl ObjectsView {
    /// What keeps `required` from being resolved: each object that is still loading, has
    /// failed, or is not watched at all, with a reason. Empty means every required object
    /// is known (present or absent).
    pub fn unresolved(&self, required: &RequiredObjects) -> Vec<(ObjectRef, String)> {
        ObjectRef::all(required)
            .filter_map(|r| {
                let known = match r.kind {
                    ObjectKind::Secret => self.objects.secrets.contains_key(&r.name),
                    ObjectKind::ConfigMap => self.objects.config_maps.contains_key(&r.name),
                } || self.absent.contains(&r);
                if known {
                    return None;
                }
                let reason = if let Some(why) = self.failed.get(&r) {
                    why.clone()
                } else if self.loading.contains(&r) {
                    "still loading".to_owned()
                } else {
                    "not watched".to_owned()
                };
                Some((r, reason))
            })
            .collect()
    }

    /// The objects of `required` that exist, for sanitizing one pod.
    pub fn select(&self, required: &RequiredObjects) -> ApiObjects {
        ApiObjects {
            secrets: (self.objects.secrets.iter())
                .filter(|(n, _)| required.secrets.contains(*n))
                .map(|(n, s)| (n.clone(), s.clone()))
                .collect(),
            config_maps: (self.objects.config_maps.iter())
                .filter(|(n, _)| required.config_maps.contains(*n))
                .map(|(n, c)| (n.clone(), c.clone()))
                .collect(),
        }
    }
}

/// Whether a controller owner exists, as looked up before deciding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OwnerStatus {
    /// The owner exists.
    Present,
    /// The API server said it does not exist (404).
    Absent,
    /// Not looked up, or the lookup failed: nothing is known. Never a reason to remove
    /// anything early.
    Unknown,
}

/// A controller owner in a namespace: the key of [`Observation::owners`]. Matched by
/// kind and name, as [`ControllerOwner::same_controller`] does.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OwnerKey {
    /// The owner's namespace (the pod's).
    pub namespace: String,
    /// `apiVersion` of the owner.
    pub api_version: String,
    /// Its kind.
    pub kind: String,
    /// Its name.
    pub name: String,
}

impl OwnerKey {
    /// The key of `owner` in `namespace`.
    pub fn new(namespace: &str, owner: &ControllerOwner) -> Self {
        Self {
            namespace: namespace.to_owned(),
            api_version: owner.api_version.clone(),
            kind: owner.kind.clone(),
            name: owner.name.clone(),
        }
    }
}

/// An object fetched by name for a pass, or why not.
#[derive(Clone, Debug, Default)]
pub enum Fetched<T> {
    /// Not asked for in this pass (it did not matter).
    #[default]
    NotFetched,
    /// The API server returned it.
    Found(Arc<T>),
    /// The API server said it does not exist (404).
    NotFound,
    /// Anything else (403, timeout, …), with why: nothing is known.
    Failed(String),
}

/// Everything the agent observed for one pass.
#[derive(Clone, Debug)]
pub struct Observation {
    /// The API server's state.
    pub api: ApiState,
    /// The API server's current problem (the failing probe's or a watch's error), for logs.
    pub api_error: Option<String>,
    /// The pods on this node in the allowed namespaces (all of them, not only parents).
    /// Complete and current only when `api` is [`ApiState::Synced`].
    pub pods: BTreeMap<PodId, Arc<Pod>>,
    /// The pods of `pods` the API server sent with fields the agent's typed model does not
    /// know (a newer API server), with those fields' paths: a checkpoint written from the
    /// model would lose them, so none is written.
    pub unknown_fields: BTreeMap<PodId, Vec<String>>,
    /// The watched Secrets and ConfigMaps, by namespace.
    pub objects: BTreeMap<String, ObjectsView>,
    /// What runs on this node.
    pub local: LocalView,
    /// Whether the controller owners of orphan candidates exist (looked up only when the
    /// GC strategy uses it; a missing entry is [`OwnerStatus::Unknown`]).
    pub owners: BTreeMap<OwnerKey, OwnerStatus>,
    /// DaemonSets fetched by name for this pass (see [`crate::daemon_set_lookups`]): the
    /// agent's own while its own pod is gone, and those of checkpoints whose pods are gone
    /// from a synced view. A missing entry is [`Fetched::NotFetched`].
    pub daemon_sets: BTreeMap<OwnerKey, Fetched<DaemonSet>>,
    /// This node (fetched with the DaemonSets).
    pub node: Fetched<Node>,
    /// This node's kubelet version, from its Node (`None` until read): what checkpoints
    /// are admitted against (see [`crate::admit`]).
    pub kubelet: Option<KubeletVersion>,
}

impl Observation {
    /// What an agent sees without any API server: unreachable, nothing listed.
    pub fn offline(local: LocalView) -> Self {
        Self {
            api: ApiState::Unreachable,
            api_error: Some("no API credentials (running offline)".into()),
            pods: BTreeMap::new(),
            unknown_fields: BTreeMap::new(),
            objects: BTreeMap::new(),
            local,
            owners: BTreeMap::new(),
            daemon_sets: BTreeMap::new(),
            node: Fetched::NotFetched,
            kubelet: None,
        }
    }

    /// The status of `owner` in `namespace`; [`OwnerStatus::Unknown`] when not looked up.
    pub fn owner_status(&self, namespace: &str, owner: &ControllerOwner) -> OwnerStatus {
        (self.owners.get(&OwnerKey::new(namespace, owner)).copied()).unwrap_or(OwnerStatus::Unknown)
    }

    /// The DaemonSet `key` as fetched for this pass ([`Fetched::NotFetched`] when it was
    /// not asked for).
    pub fn daemon_set(&self, key: &OwnerKey) -> &Fetched<DaemonSet> {
        static NOT_FETCHED: Fetched<DaemonSet> = Fetched::NotFetched;
        self.daemon_sets.get(key).unwrap_or(&NOT_FETCHED)
    }
}

/// What runs on this node, from the container runtime (or the kubelet with CRI off).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LocalView {
    /// The source failed: not "nothing is running".
    Unknown,
    /// The source answered.
    Known {
        /// Parents running locally under their own name (a checkpoint's static pod runs
        /// as `<name>-<node>`, so it never counts as its parent running).
        running: BTreeSet<PodId>,
        /// The ids of the running containers of each pod in `running`, as the runtime
        /// names them (no `<runtime>://` prefix): what tells a parent's current status from
        /// one the API kept from before a reboot ([`READY_SETTLE`](crate::READY_SETTLE)).
        /// A pod missing here has no container known to run: its `Ready` never counts.
        containers: BTreeMap<PodId, BTreeSet<String>>,
        /// Parents the kubelet knows about. Informational only: a checkpoint's content
        /// always comes from the API copy, so a stale kubelet never creates one.
        kubelet_parents: BTreeSet<PodId>,
        /// The restart counts of the static pods of the checkpoints a plan asked about
        /// ([`Report::watch_restarts`](crate::Report::watch_restarts)), by checkpoint: the highest attempt among each one's
        /// containers, as the runtime shows it. One not seen (no container yet, no CRI) is
        /// missing.
        restarts: BTreeMap<PodId, u32>,
    },
}

/// One stored copy of a checkpoint (inactive or active).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredCopy {
    /// What the manifest says about itself.
    pub meta: CheckpointMeta,
    /// SHA-256 of the file's bytes, to compare the active copy with the inactive one.
    pub digest: String,
}

/// A checkpoint as found on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskCheckpoint {
    /// In the inactive-manifests directory.
    pub inactive: Option<StoredCopy>,
    /// In the kubelet's manifests directory.
    pub active: Option<StoredCopy>,
}

impl DiskCheckpoint {
    /// What the inactive copy (else the active one) says about itself.
    pub fn meta(&self) -> Option<&CheckpointMeta> {
        self.inactive.as_ref().or(self.active.as_ref()).map(|c| &c.meta)
    }
}

/// What the API server tells us, in the three states that matter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ApiView {
    /// The health probe fails: down, refusing or hung. Only this state activates.
    Unreachable,
    /// It answers but we have no complete list since the last outage (a 403 while RBAC
    /// warms up, a relist in progress): neither activates nor garbage-collects.
    Reachable,
    /// A complete, current list of the parents on this node. Only this state removes.
    Synced {
        /// Every parent pod on this node (annotated, in an allowed namespace).
        parents: BTreeMap<PodId, ApiParent>,
    },
}

/// A parent as listed by the API server.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ApiParent {
    /// The pod's UID.
    pub(crate) uid: Option<String>,
    /// The pod's controller owner.
    pub(crate) owner: Option<ControllerOwner>,
    /// It has completed (phase `Succeeded` or `Failed` with `restartPolicy` `Never` or
    /// `OnFailure`): it will never run again, and a static copy would run its work again.
    pub(crate) completed: bool,
    /// It asks for its checkpoint to stay until it is Ready
    /// ([`crate::identity::HANDOFF_WHEN_READY`]).
    pub(crate) retires_when_ready: bool,
    /// Its `pod-template-generation` label: the newest of a DaemonSet's revisions is the
    /// one of the highest.
    pub(crate) template_generation: Option<i64>,
}

/// Whether the agent's own DaemonSet still targets this node: what decides self-GC
/// (ARCHITECTURE.md, Self-checkpoint, lock and self-GC).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SelfScheduling {
    /// It targets this node (or a DaemonSet of the same name that replaced it does): the
    /// agent's own pod being absent is a rollout, an eviction or a controller outage. Keep
    /// everything, whatever the strategy says.
    Targeted,
    /// It exists but no longer targets this node (why attached): self-GC once the grace
    /// period has passed since the first read saying so (journalled).
    Descheduled(String),
    /// It is deleted (404) and nothing of the same name took its place: self-GC once the
    /// grace period has passed since the first read saying so and since the agent's own
    /// pod left.
    Deleted,
    /// Not known (why attached: no owner known, not a DaemonSet, a failed or forbidden
    /// read, this node's Node not registered): keep everything, whatever the strategy says
    /// (issue 36: only positive evidence removes).
    Unknown(String),
}

impl SelfScheduling {
    /// Every [`SelfScheduling::as_str`] name, in declaration order, for metrics.
    pub const NAMES: [&'static str; 4] = ["targeted", "descheduled", "deleted", "unknown"];

    /// `targeted`, `descheduled`, `deleted` or `unknown` (the reason left out), for
    /// metrics: an `unknown` one holds self-GC back.
    pub fn as_str(&self) -> &'static str {
        match self {
            SelfScheduling::Targeted => "targeted",
            SelfScheduling::Descheduled(_) => "descheduled",
            SelfScheduling::Deleted => "deleted",
            SelfScheduling::Unknown(_) => "unknown",
        }
    }
}
