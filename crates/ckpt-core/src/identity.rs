//! Who is who: pod identity, parents, checkpoints, the agent itself, controller owners.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

/// Marks a parent: a pod that asks to be checkpointed (value exactly `"true"`).
pub const ANNOTATION_CHECKPOINT: &str = "checkpointer.alpha.coreos.com/checkpoint";
/// On a parent (and copied to its checkpoints): how its checkpoint hands the node back to
/// it; [`HANDOFF_WHEN_READY`] is the one value (absent: the checkpoint steps aside as soon
/// as the parent runs).
pub(crate) const ANNOTATION_HANDOFF: &str = "checkpointer.alpha.coreos.com/handoff";
/// [`ANNOTATION_HANDOFF`]'s value for a parent that binds its ports beside its running
/// checkpoint (`SO_REUSEPORT`: kube-apiserver's `--permit-port-sharing`): the checkpoint
/// stays until the parent is Ready instead of stepping aside when it runs.
pub(crate) const HANDOFF_WHEN_READY: &str = "when-ready";
/// Marks a checkpoint; the value is the parent's name (bootkube's format).
pub const ANNOTATION_CHECKPOINT_OF: &str = "checkpointer.alpha.coreos.com/checkpoint-of";
/// Our addition: the parent's UID.
pub(crate) const ANNOTATION_PARENT_UID: &str = "checkpointer.alpha.coreos.com/parent-uid";
/// Our addition: the parent's controller owner as `apiVersion/kind/name/uid`.
pub(crate) const ANNOTATION_OWNER: &str = "checkpointer.alpha.coreos.com/owner";
/// Our addition: hash of the sanitized manifest and its materialized files.
pub(crate) const ANNOTATION_SPEC_HASH: &str = "checkpointer.alpha.coreos.com/spec-hash";
/// Our addition: when this content was first checkpointed (RFC 3339, UTC).
pub(crate) const ANNOTATION_CHECKPOINTED_AT: &str = "checkpointer.alpha.coreos.com/checkpointed-at";
/// On this node's Node, `"true"`: the operator retires the node, so a self-GC removes
/// every checkpoint, even an active one serving a DaemonSet that still targets the node
/// (issue 36). Under the project's own domain, as every key added from now on.
pub const ANNOTATION_DECOMMISSION: &str = "pod-checkpointer.github.io/decommission";
/// Set by the DaemonSet controller on its pods: the DaemonSet's `metadata.generation` whose
/// template made the pod. Checkpoints keep it (sanitization keeps a pod's labels).
pub(crate) const LABEL_POD_TEMPLATE_GENERATION: &str = "pod-template-generation";
/// Set by the kubelet on pods it read from a file (static pods).
pub(crate) const ANNOTATION_CONFIG_SOURCE: &str = "kubernetes.io/config.source";
/// Set by the kubelet on the API mirror of a static pod.
pub(crate) const ANNOTATION_CONFIG_MIRROR: &str = "kubernetes.io/config.mirror";

/// A pod's identity: namespace and name. Ordered, so every list we emit is sorted.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PodId {
    /// The pod's namespace.
    pub namespace: Arc<str>,
    /// The pod's name.
    pub name: Arc<str>,
}

impl PodId {
    /// A pod id from namespace and name. Shared strings: every pass hands ids from its
    /// inputs to its plan, and a clone is then a count, not two allocations.
    pub fn new(namespace: impl AsRef<str>, name: impl AsRef<str>) -> Self {
        Self {
            namespace: Arc::from(namespace.as_ref()),
            name: Arc::from(name.as_ref()),
        }
    }

    /// The id of a pod object, if it has a name (a namespace defaults to `default`).
    pub fn of(pod: &Pod) -> Option<Self> {
        let name = pod.metadata.name.as_deref().filter(|n| !n.is_empty())?;
        let namespace = pod
            .metadata
            .namespace
            .as_deref()
            .filter(|n| !n.is_empty())
            .unwrap_or("default");
        Some(Self::new(namespace, name))
    }

    /// The name the kubelet of `node` gives this pod's checkpoint when it runs it as a
    /// static pod (`generatePodName`: `<name>-<node>`, the node's name lowercased): what
    /// the runtime labels its containers with.
    pub fn static_pod_name(&self, node: &str) -> String {
        format!("{}-{}", self.name, node.to_lowercase())
    }

    /// The file name of this pod's checkpoint manifest: `<namespace>_<name>.json`.
    ///
    /// Collision-free because `_` can appear neither in a namespace (a DNS label) nor in
    /// a pod name (a DNS subdomain); bootkube's `<namespace>-<name>.json` collides for
    /// `a-b/c` and `a/b-c`.
    pub fn manifest_file_name(&self) -> String {
        format!("{}_{}.json", self.namespace, self.name)
    }

    /// The pod whose checkpoint manifest this file name is ([`PodId::manifest_file_name`]);
    /// `None` for any other name (bootkube's legacy names are ambiguous).
    pub fn from_manifest_file_name(file_name: &str) -> Option<Self> {
        let (namespace, name) = file_name.strip_suffix(".json")?.split_once('_')?;
        (!namespace.is_empty() && !name.is_empty() && !name.contains('_')).then(|| Self::new(namespace, name))
    }

    /// The file name the original bootkube checkpointer used (`<namespace>-<name>.json`),
    /// recognised when adopting its checkpoints.
    pub fn legacy_manifest_file_name(&self) -> String {
        format!("{}-{}.json", self.namespace, self.name)
    }
}

impl fmt::Display for PodId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The controller owner of a pod (the DaemonSet, ReplicaSet, … that manages it).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ControllerOwner {
    /// The owner's `apiVersion`, e.g. `apps/v1`.
    pub api_version: String,
    /// The owner's kind, e.g. `DaemonSet`.
    pub kind: String,
    /// The owner's name (in the pod's namespace).
    pub name: String,
    /// The owner's UID.
    pub uid: String,
}

impl ControllerOwner {
    /// The controller owner reference of a pod, if any.
    pub fn of(pod: &Pod) -> Option<Self> {
        let refs = pod.metadata.owner_references.as_ref()?;
        let owner = refs.iter().find(|r| r.controller == Some(true))?;
        Some(Self {
            api_version: owner.api_version.clone(),
            kind: owner.kind.clone(),
            name: owner.name.clone(),
            uid: owner.uid.clone(),
        })
    }

    /// The owner as stored in the `checkpointer.alpha.coreos.com/owner` annotation:
    /// `apiVersion/kind/name/uid`.
    pub fn to_annotation(&self) -> String {
        format!("{}/{}/{}/{}", self.api_version, self.kind, self.name, self.uid)
    }

    /// Parses the `checkpointer.alpha.coreos.com/owner` annotation; `None` for anything
    /// malformed.
    pub fn from_annotation(value: &str) -> Option<Self> {
        // apiVersion may itself contain one `/` (`apps/v1`), so split from the right.
        let mut parts = value.rsplitn(4, '/');
        let uid = parts.next()?;
        let name = parts.next()?;
        let kind = parts.next()?;
        let api_version = parts.next()?;
        [api_version, kind, name, uid]
            .iter()
            .all(|p| !p.is_empty())
            .then(|| Self {
                api_version: api_version.to_owned(),
                kind: kind.to_owned(),
                name: name.to_owned(),
                uid: uid.to_owned(),
            })
    }

    /// Same controller, across a rolling update: same kind and name. (A controller that
    /// was deleted and re-created under the same name manages the same workload.)
    pub fn same_controller(&self, other: &Self) -> bool {
        self.kind == other.kind && self.name == other.name
    }
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

/// Whether a pod is a checkpoint (it carries [`ANNOTATION_CHECKPOINT_OF`], any value).
pub(crate) fn is_checkpoint(pod: &Pod) -> bool {
    annotation(pod, ANNOTATION_CHECKPOINT_OF).is_some()
}

/// Whether a pod is a static pod or the API mirror of one.
pub(crate) fn is_static_or_mirror(pod: &Pod) -> bool {
    annotation(pod, ANNOTATION_CONFIG_SOURCE) == Some("file")
        || annotation(pod, ANNOTATION_CONFIG_MIRROR).is_some()
}

/// Which namespaces the agent may checkpoint pods from (`--namespaces`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceAllowList(BTreeSet<String>);

impl NamespaceAllowList {
    /// An allow-list of these namespaces.
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(namespaces: I) -> Self {
        Self(namespaces.into_iter().map(Into::into).collect())
    }

    /// Whether the namespace is allowed.
    pub fn allows(&self, namespace: &str) -> bool {
        self.0.contains(namespace)
    }

    /// The allowed namespaces, sorted.
    pub fn namespaces(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }
}

/// Whether a pod is a parent: annotated with exactly `"true"`, not static or mirror, not
/// itself a checkpoint, in an allowed namespace. Pods outside the allow-list are never
/// parents, whatever told us about them (this ends bootkube's resurrection loop).
pub fn is_parent(pod: &Pod, allowed: &NamespaceAllowList) -> bool {
    annotation(pod, ANNOTATION_CHECKPOINT) == Some("true")
        && !is_static_or_mirror(pod)
        && !is_checkpoint(pod)
        && PodId::of(pod).is_some_and(|id| allowed.allows(&id.namespace))
}

/// Whether the agent's own pod is checkpointed: without that checkpoint no static copy
/// restarts the agent after a reboot, and nothing activates the other checkpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SelfCheckpointing {
    /// Every pod of the agent's own on this node is a parent.
    Checkpointed,
    /// The agent's namespace is outside `--namespaces`: its pod is never read, so never
    /// checkpointed (known without the API).
    NamespaceNotAllowed,
    /// A pod of the agent's own lacks [`ANNOTATION_CHECKPOINT`]` = "true"`.
    NotAnnotated,
}

impl SelfCheckpointing {
    /// Why the agent is not checkpointed, for a warning; `None` when it is.
    pub fn problem(self, me: &SelfIdentity) -> Option<String> {
        match self {
            SelfCheckpointing::Checkpointed => None,
            SelfCheckpointing::NamespaceNotAllowed => {
                Some(format!("its namespace {} is not in --namespaces", me.namespace))
            }
            SelfCheckpointing::NotAnnotated => Some(format!(
                "its pod lacks the annotation {ANNOTATION_CHECKPOINT}: \"true\""
            )),
        }
    }
}

/// Whether the agent's own pod is checkpointed, from the pods of a synced view of this
/// node (`None` when the view is not synced). `None` while that cannot be told: the view
/// not synced, or no pod of the agent's own listed (the static copy holding the lock while
/// its DaemonSet pod is not scheduled here).
pub fn self_checkpointing<'a>(
    me: &SelfIdentity,
    allowed: &NamespaceAllowList,
    synced_pods: Option<impl IntoIterator<Item = (&'a PodId, &'a Pod)>>,
) -> Option<SelfCheckpointing> {
    if !allowed.allows(&me.namespace) {
        return Some(SelfCheckpointing::NamespaceNotAllowed);
    }
    let mut own = (synced_pods?.into_iter())
        .filter(|(id, pod)| me.is_self(id, ControllerOwner::of(pod).as_ref()))
        .filter(|(_, pod)| !is_static_or_mirror(pod) && !is_checkpoint(pod))
        .peekable();
    own.peek()?;
    // One pod without the annotation is enough: during a rollout that drops it, the new
    // pod's template is what the node will run.
    Some(match own.all(|(_, pod)| is_parent(pod, allowed)) {
        true => SelfCheckpointing::Checkpointed,
        false => SelfCheckpointing::NotAnnotated,
    })
}

/// Whether a pod has completed: a Job's pod (`restartPolicy` `Never` or `OnFailure`) in
/// phase `Succeeded` or `Failed` — its work is done or given up, and a static copy would
/// run it again at every reboot. Any other pod that ended stands for a workload meant to
/// run: a control-plane pod with `restartPolicy: Never` that crashed, or was stopped and
/// exited 0 (`Succeeded`), is exactly what its checkpoint must bring back.
pub(crate) fn has_completed(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    let policy = pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref());
    let job = ControllerOwner::of(pod).is_some_and(|o| o.kind == "Job");
    job && matches!(policy, Some("Never" | "OnFailure")) && matches!(phase, Some("Succeeded" | "Failed"))
}

/// A DaemonSet pod's template generation ([`LABEL_POD_TEMPLATE_GENERATION`]), for a parent
/// or a checkpoint made of one; `None` when absent or not a number.
pub(crate) fn template_generation(pod: &Pod) -> Option<i64> {
    let labels = pod.metadata.labels.as_ref()?;
    labels.get(LABEL_POD_TEMPLATE_GENERATION)?.parse().ok()
}

/// Whether a pod (a parent, or a checkpoint made of one) asks for its checkpoint to stay
/// until it is Ready ([`HANDOFF_WHEN_READY`]).
pub(crate) fn retires_when_ready(pod: &Pod) -> bool {
    annotation(pod, ANNOTATION_HANDOFF) == Some(HANDOFF_WHEN_READY)
}

/// The agent's own identity, valid for both its DaemonSet copy and its static copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelfIdentity {
    /// The agent's namespace (`POD_NAMESPACE`).
    pub namespace: String,
    /// The agent's parent pod name: `POD_NAME`, with the static copy's `-<node>` suffix removed.
    pub parent_name: String,
    /// The node (`NODE_NAME`).
    pub node: String,
    /// The agent's controller owner (its DaemonSet), once known from the API or from its
    /// own checkpoint; it recognises the agent's parent across rolling updates.
    pub owner: Option<ControllerOwner>,
}

impl SelfIdentity {
    /// The identity from the downward-API values. The kubelet names a static pod
    /// `<name>-<node>`, so the static copy strips that suffix to find its parent.
    pub fn new(namespace: &str, pod_name: &str, node: &str) -> Self {
        let suffix = format!("-{node}");
        let parent_name = pod_name
            .strip_suffix(&suffix)
            .filter(|n| !n.is_empty())
            .unwrap_or(pod_name);
        Self {
            namespace: namespace.to_owned(),
            parent_name: parent_name.to_owned(),
            node: node.to_owned(),
            owner: None,
        }
    }

    /// The same identity with a known controller owner.
    pub fn with_owner(mut self, owner: Option<ControllerOwner>) -> Self {
        self.owner = owner;
        self
    }

    /// The id of the agent's own parent pod as it was started.
    pub fn parent_id(&self) -> PodId {
        PodId::new(&self.namespace, &self.parent_name)
    }

    /// Whether a pod (parent or checkpoint, by id and controller owner) is one of the
    /// agent's own pods: its own name, or another pod of its own controller (a rolled
    /// DaemonSet pod gets a new name but keeps the owner).
    pub fn is_self(&self, id: &PodId, owner: Option<&ControllerOwner>) -> bool {
        if *id.namespace != *self.namespace {
            return false;
        }
        if *id.name == *self.parent_name {
            return true;
        }
        // By the controller's UID: a pod that merely claims an owner of the same kind and
        // name (anyone may write ownerReferences) is not the agent's.
        match (owner, &self.owner) {
            (Some(theirs), Some(ours)) => {
                !ours.uid.is_empty() && theirs.uid == ours.uid && theirs.kind == ours.kind
            }
            _ => false,
        }
    }
}

/// Whether `name` is a DNS-1123 label, what Kubernetes requires of a namespace name:
/// at most 63 characters of `[a-z0-9-]`, starting and ending with a letter or digit.
pub fn is_dns_label(name: &str) -> bool {
    name.len() <= 63 && is_label_text(name)
}

/// Whether `name` is a DNS-1123 subdomain, what Kubernetes requires of a pod, Secret or
/// ConfigMap name: at most 253 characters, dot-separated labels (as Kubernetes checks it,
/// a label in a subdomain has no length limit of its own).
pub fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253 && name.split('.').all(is_label_text)
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, of any length.
fn is_label_text(s: &str) -> bool {
    let bytes = s.as_bytes();
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            alnum(first) && alnum(last) && bytes.iter().all(|b| alnum(b) || *b == b'-')
        }
        _ => false,
    }
}

/// How a running agent names itself as the holder of its lock file (see `ckpt-lock`):
/// `pod-checkpointer pod=<namespace>/<pod name> node=<node>`. `drain` reads it back to
/// remove the agent's own checkpoint last (removing it stops the static copy).
///
/// ```
/// use ckpt_core::{LockIdentity, PodId};
///
/// let identity = LockIdentity::new("kube-system", "pc-abc-node-1", "node-1");
/// let text = identity.to_string();
/// assert_eq!(text, "pod-checkpointer pod=kube-system/pc-abc-node-1 node=node-1");
/// let parsed = LockIdentity::parse(&text).expect("an agent's identity");
/// assert_eq!(parsed.parent_id(), PodId::new("kube-system", "pc-abc"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockIdentity {
    /// The agent's namespace (`POD_NAMESPACE`).
    pub namespace: String,
    /// The agent's pod name as it runs (`POD_NAME`): the static copy's has the `-<node>` suffix.
    pub pod_name: String,
    /// The node (`NODE_NAME`).
    pub node: String,
}

impl LockIdentity {
    /// The identity from the downward-API values.
    pub fn new(namespace: &str, pod_name: &str, node: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            pod_name: pod_name.to_owned(),
            node: node.to_owned(),
        }
    }

    /// Reads an identity back from a lock holder record: the `pod=<namespace>/<name>` and
    /// `node=<node>` words, in any order. `None` for another holder (`drain`, `flock(1)`,
    /// bootkube) or a record without both words.
    pub fn parse(text: &str) -> Option<Self> {
        let word = |key: &str| {
            text.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .filter(|v| !v.is_empty())
        };
        let (namespace, pod_name) = word("pod=")?.split_once('/')?;
        let node = word("node=")?;
        (!namespace.is_empty() && !pod_name.is_empty()).then(|| Self::new(namespace, pod_name, node))
    }

    /// The agent's parent pod, the same for its DaemonSet copy and its static copy.
    pub fn parent_id(&self) -> PodId {
        SelfIdentity::new(&self.namespace, &self.pod_name, &self.node).parent_id()
    }
}

impl fmt::Display for LockIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pod-checkpointer pod={}/{} node={}",
            self.namespace, self.pod_name, self.node
        )
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    use super::*;

    fn pod(ns: &str, name: &str, annotations: &[(&str, &str)]) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| ((*k).into(), (*v).into()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn whether_the_agent_checkpoints_itself() {
        use SelfCheckpointing::*;
        let me = SelfIdentity::new("kube-system", "pc-abc", "node-1");
        let on = [(ANNOTATION_CHECKPOINT, "true")];
        let own = |annotations: &[(&str, &str)]| pod("kube-system", "pc-abc", annotations);
        let check = |allowed: &[&str], pods: Option<Vec<Pod>>, expected: Option<SelfCheckpointing>| {
            let pods: Option<BTreeMap<PodId, Pod>> =
                (pods.clone()).map(|pods| pods.into_iter().map(|p| (PodId::of(&p).unwrap(), p)).collect());
            let allow = NamespaceAllowList::new(allowed.iter().copied());
            let got = self_checkpointing(&me, &allow, pods.as_ref().map(|p| p.iter()));
            assert_eq!(got, expected, "allowed {allowed:?}, pods {pods:?}");
        };
        check(&["kube-system"], Some(vec![own(&on)]), Some(Checkpointed));
        check(&["kube-system"], Some(vec![own(&[])]), Some(NotAnnotated));
        check(
            &["kube-system"],
            Some(vec![own(&[(ANNOTATION_CHECKPOINT, "yes")])]),
            Some(NotAnnotated),
        );
        // Known from the configuration alone, synced or not.
        check(&["cni"], None, Some(NamespaceNotAllowed));
        check(
            &["cni", "kube-system2"],
            Some(vec![own(&on)]),
            Some(NamespaceNotAllowed),
        );
        // Unknown: not synced, or no pod of its own listed (its static copy is no parent).
        check(&["kube-system"], None, None);
        check(&["kube-system"], Some(vec![]), None);
        let static_copy = pod(
            "kube-system",
            "pc-abc-node-1",
            &[
                (ANNOTATION_CHECKPOINT, "true"),
                (ANNOTATION_CONFIG_MIRROR, "hash"),
            ],
        );
        check(
            &["kube-system"],
            Some(vec![static_copy.clone(), pod("kube-system", "other", &on)]),
            None,
        );
        check(
            &["kube-system"],
            Some(vec![static_copy, own(&on)]),
            Some(Checkpointed),
        );
    }

    #[test]
    fn manifest_file_names_read_back() {
        let check = |file_name: &str, expected: Option<(&str, &str)>| {
            let got = PodId::from_manifest_file_name(file_name);
            assert_eq!(got, expected.map(|(ns, n)| PodId::new(ns, n)), "{file_name}");
            if let Some(id) = got {
                assert_eq!(id.manifest_file_name(), file_name);
            }
        };
        check(
            "kube-system_kube-apiserver-abc.json",
            Some(("kube-system", "kube-apiserver-abc")),
        );
        check("a_b.c.json", Some(("a", "b.c")));
        check("kube-system-kube-apiserver.json", None);
        check("kube-system_kube-apiserver", None);
        check("_name.json", None);
        check("ns_.json", None);
        check("a_b_c.json", None);
        check(".json", None);
    }

    #[test]
    fn dns_names() {
        // (name, a DNS label, a DNS subdomain)
        let check = |name: &str, expected: (bool, bool)| {
            assert_eq!((is_dns_label(name), is_dns_subdomain(name)), expected, "{name:?}")
        };
        let label_63 = "a".repeat(63);
        let label_64 = "a".repeat(64);
        let subdomain_253 = format!("{}.{}", "a".repeat(199), "b".repeat(53));
        let subdomain_254 = format!("{subdomain_253}c");
        let cases: &[(&str, (bool, bool))] = &[
            ("kube-system", (true, true)),
            ("a", (true, true)),
            ("0a-9", (true, true)),
            (&label_63, (true, true)),
            (&label_64, (false, true)),
            ("a.b.c", (false, true)),
            (&subdomain_253, (false, true)),
            (&subdomain_254, (false, false)),
            ("", (false, false)),
            ("-a", (false, false)),
            ("a-", (false, false)),
            ("A", (false, false)),
            ("Kube_System", (false, false)),
            ("a_b", (false, false)),
            (".", (false, false)),
            ("..", (false, false)),
            ("a..b", (false, false)),
            (".a", (false, false)),
            ("a.", (false, false)),
            ("a/b", (false, false)),
            ("a\0b", (false, false)),
            ("é", (false, false)),
        ];
        for (name, expected) in cases {
            check(name, *expected);
        }
    }

    #[test]
    fn lock_identity_round_trips_and_names_the_parent() {
        let check = |text: &str, expected: Option<(LockIdentity, PodId)>| {
            let parsed = LockIdentity::parse(text);
            assert_eq!(
                parsed.clone().map(|i| {
                    let parent = i.parent_id();
                    (i, parent)
                }),
                expected,
                "{text:?}"
            );
            if let Some(identity) = parsed
                && text.starts_with("pod-checkpointer pod=")
            {
                assert_eq!(identity.to_string(), text, "Display writes what parse reads");
            }
        };
        let id = LockIdentity::new;
        check(
            "pod-checkpointer pod=kube-system/pc-abc node=n1",
            Some((
                id("kube-system", "pc-abc", "n1"),
                PodId::new("kube-system", "pc-abc"),
            )),
        );
        // The static copy: the kubelet's `-<node>` suffix is not part of the parent.
        check(
            "pod-checkpointer pod=kube-system/pc-abc-n1 node=n1",
            Some((
                id("kube-system", "pc-abc-n1", "n1"),
                PodId::new("kube-system", "pc-abc"),
            )),
        );
        check(
            "node=n1 pod=ns/p",
            Some((id("ns", "p", "n1"), PodId::new("ns", "p"))),
        );
        check("flock", None);
        check("pod-checkpointer drain pid=42", None);
        check("pod-checkpointer pod=broken node=n1", None);
        check("pod-checkpointer pod=kube-system/pc-abc", None);
        check("pod-checkpointer pod=/pc node=n1", None);
        check("pod-checkpointer pod=ns/ node=n1", None);
        check("pod-checkpointer pod=ns/p node=", None);
        check("", None);
    }

    #[test]
    fn parent_predicate() {
        let allowed = NamespaceAllowList::new(["kube-system"]);
        let check = |p: Pod, expected: bool| assert_eq!(is_parent(&p, &allowed), expected, "{p:?}");
        type Case<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)], bool);
        let cases: &[Case<'_>] = &[
            ("kube-system", "api", &[(ANNOTATION_CHECKPOINT, "true")], true),
            ("kube-system", "api", &[(ANNOTATION_CHECKPOINT, "True")], false),
            ("kube-system", "api", &[(ANNOTATION_CHECKPOINT, "")], false),
            ("kube-system", "api", &[], false),
            ("default", "api", &[(ANNOTATION_CHECKPOINT, "true")], false),
            (
                "kube-system",
                "api",
                &[
                    (ANNOTATION_CHECKPOINT, "true"),
                    (ANNOTATION_CONFIG_SOURCE, "file"),
                ],
                false,
            ),
            (
                "kube-system",
                "api",
                &[(ANNOTATION_CHECKPOINT, "true"), (ANNOTATION_CONFIG_SOURCE, "api")],
                true,
            ),
            (
                "kube-system",
                "api",
                &[(ANNOTATION_CHECKPOINT, "true"), (ANNOTATION_CONFIG_MIRROR, "abc")],
                false,
            ),
            (
                "kube-system",
                "api",
                &[(ANNOTATION_CHECKPOINT, "true"), (ANNOTATION_CHECKPOINT_OF, "")],
                false,
            ),
        ];
        for (ns, name, ann, expected) in cases {
            check(pod(ns, name, ann), *expected);
        }
        assert!(
            !is_parent(&Pod::default(), &allowed),
            "a pod without a name is never a parent"
        );
    }

    #[test]
    fn template_generation_from_the_label() {
        let check = |label: Option<&str>, expected: Option<i64>| {
            let mut p = pod("kube-system", "api-x", &[]);
            p.metadata.labels =
                label.map(|v| [(LABEL_POD_TEMPLATE_GENERATION.to_owned(), v.to_owned())].into());
            assert_eq!(template_generation(&p), expected, "{label:?}");
        };
        check(Some("7"), Some(7));
        check(Some("9223372036854775807"), Some(i64::MAX));
        check(None, None);
        check(Some(""), None);
        check(Some("seven"), None);
        check(Some("99999999999999999999"), None);
    }

    #[test]
    fn checkpoint_predicate() {
        assert!(is_checkpoint(&pod("a", "b", &[(ANNOTATION_CHECKPOINT_OF, "")])));
        assert!(is_checkpoint(&pod("a", "b", &[(ANNOTATION_CHECKPOINT_OF, "b")])));
        assert!(!is_checkpoint(&pod("a", "b", &[(ANNOTATION_CHECKPOINT, "true")])));
        assert!(!is_checkpoint(&Pod::default()));
    }

    #[test]
    fn self_identity() {
        let owner = ControllerOwner {
            api_version: "apps/v1".into(),
            kind: "DaemonSet".into(),
            name: "pod-checkpointer".into(),
            uid: "u1".into(),
        };
        let rolled_owner = ControllerOwner {
            uid: "u2".into(),
            ..owner.clone()
        };
        let other_owner = ControllerOwner {
            name: "other".into(),
            uid: "u3".into(),
            ..owner.clone()
        };
        let check = |pod_name: &str, id: PodId, their_owner: Option<&ControllerOwner>, expected: bool| {
            let me = SelfIdentity::new("kube-system", pod_name, "node-1").with_owner(Some(owner.clone()));
            assert_eq!(me.is_self(&id, their_owner), expected, "{pod_name} vs {id}");
        };
        // DaemonSet copy and static copy name the same parent.
        check("pc-abc", PodId::new("kube-system", "pc-abc"), None, true);
        check("pc-abc-node-1", PodId::new("kube-system", "pc-abc"), None, true);
        // A suffix for another node is part of the name.
        check("pc-abc-node-2", PodId::new("kube-system", "pc-abc"), None, false);
        check("pc-abc", PodId::new("default", "pc-abc"), None, false);
        // Rolled pod of the same DaemonSet.
        check("pc-abc", PodId::new("kube-system", "pc-xyz"), Some(&owner), true);
        // Same kind and name, another UID: another DaemonSet (re-created, or a pod that
        // merely claims the owner) is not the agent's.
        check(
            "pc-abc",
            PodId::new("kube-system", "pc-xyz"),
            Some(&rolled_owner),
            false,
        );
        check(
            "pc-abc",
            PodId::new("kube-system", "pc-xyz"),
            Some(&other_owner),
            false,
        );
        check("pc-abc", PodId::new("kube-system", "pc-xyz"), None, false);
        // A pod named exactly like the node suffix keeps its name.
        assert_eq!(
            SelfIdentity::new("ns", "-node-1", "node-1").parent_name,
            "-node-1"
        );
    }

    #[test]
    fn owner_extraction_and_annotation_round_trip() {
        let mut p = pod("kube-system", "pc-abc", &[]);
        assert_eq!(ControllerOwner::of(&p), None);
        let reference = |controller: Option<bool>, name: &str| OwnerReference {
            api_version: "apps/v1".into(),
            kind: "DaemonSet".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            controller,
            ..Default::default()
        };
        p.metadata.owner_references = Some(vec![
            reference(None, "a"),
            reference(Some(false), "b"),
            reference(Some(true), "c"),
        ]);
        let owner = ControllerOwner::of(&p).expect("controller owner");
        assert_eq!(owner.name, "c");
        assert_eq!(owner.to_annotation(), "apps/v1/DaemonSet/c/uid-c");
        assert_eq!(
            ControllerOwner::from_annotation(&owner.to_annotation()),
            Some(owner)
        );
        let core = ControllerOwner::from_annotation("v1/Node/n/u").expect("core group");
        assert_eq!((core.api_version.as_str(), core.kind.as_str()), ("v1", "Node"));
        for bad in ["", "a/b/c", "apps/v1//n/u", "/////"] {
            assert_eq!(ControllerOwner::from_annotation(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn bug9_file_names_do_not_collide() {
        // bootkube: `a-b/c` and `a/b-c` both became `a-b-c.json`.
        let x = PodId::new("a-b", "c");
        let y = PodId::new("a", "b-c");
        assert_eq!(x.legacy_manifest_file_name(), y.legacy_manifest_file_name());
        assert_ne!(x.manifest_file_name(), y.manifest_file_name());
        let names: BTreeMap<String, PodId> = [x, y]
            .into_iter()
            .map(|id| (id.manifest_file_name(), id))
            .collect();
        assert_eq!(names.len(), 2);
    }

    #[test]
    fn pod_id_of_defaults_namespace() {
        let mut p = pod("", "x", &[]);
        assert_eq!(PodId::of(&p), Some(PodId::new("default", "x")));
        p.metadata.name = None;
        assert_eq!(PodId::of(&p), None);
        assert_eq!(PodId::new("a", "b").to_string(), "a/b");
    }
}
