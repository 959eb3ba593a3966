//! Which API objects a pod refers to: what must be fetched before sanitizing, and the
//! kubelet's (≥1.34) rule that a static pod may refer to none.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, EnvFromSource, EnvVar, Pod, Volume};

use crate::identity::{ControllerOwner, PodId, SelfIdentity};

/// The most Secrets and ConfigMaps one parent may reference, together: the agent watches
/// each one (as the kubelet does), so a pod referencing more is refused, with an Event,
/// before any watch starts. A control-plane pod references a handful.
pub(crate) const MAX_OBJECTS_PER_POD: usize = 64;

/// The most Secrets and ConfigMaps the agent watches on a node, for every parent
/// together (each watch holds a connection to the API server). Parents are taken in
/// [`WatchPriority`] order; one whose objects not watched yet would go past the bound is
/// refused, with an Event, before any watch of it starts.
pub(crate) const MAX_WATCHED_OBJECTS: usize = 256;

/// The namespace whose pods are the control plane's, whatever their labels.
const CONTROL_PLANE_NAMESPACE: &str = "kube-system";

/// The order in which parents get the node's watch budget: the agent's own pod, then the
/// control plane's (namespace `kube-system`, or labelled `tier: control-plane` as kubeadm's
/// and bootkube's are), then the others; within each, the oldest first, then by namespace
/// and name. Stable from pass to pass, and a parent created later never takes the watches
/// of one already served, so a new parent that sorts first by name cannot evict the
/// kube-apiserver's (it did when the budget went by name).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct WatchPriority<'a> {
    tier: u8,
    /// `None` (never from the API server) sorts after every time.
    created: (bool, Option<jiff::Timestamp>),
    id: &'a PodId,
}

impl<'a> WatchPriority<'a> {
    fn of(id: &'a PodId, pod: &Pod, me: &SelfIdentity) -> Self {
        let control_plane = &*id.namespace == CONTROL_PLANE_NAMESPACE
            || (pod.metadata.labels.as_ref())
                .and_then(|labels| labels.get("tier"))
                .is_some_and(|tier| tier == "control-plane");
        let tier = if me.is_self(id, ControllerOwner::of(pod).as_ref()) {
            0
        } else if control_plane {
            1
        } else {
            2
        };
        let created = pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
        Self {
            tier,
            created: (created.is_none(), created),
            id,
        }
    }
}

/// The parents, of `parents`, that reference more Secrets and ConfigMaps than one pod
/// may, or whose objects not referenced by a parent before them ([`WatchPriority`]) would
/// take the node past [`MAX_WATCHED_OBJECTS`]: nothing of them is watched.
pub(crate) fn over_watch_budget<'a, I>(parents: I, me: &SelfIdentity) -> BTreeMap<PodId, String>
where
    I: IntoIterator<Item = (&'a PodId, &'a Pod)>,
{
    let mut parents: Vec<(WatchPriority<'a>, &'a Pod)> = (parents.into_iter())
        .map(|(id, pod)| (WatchPriority::of(id, pod, me), pod))
        .collect();
    parents.sort_by(|a, b| a.0.cmp(&b.0));
    let mut watched: BTreeSet<(&str, bool, String)> = BTreeSet::new();
    let mut over = BTreeMap::new();
    for (WatchPriority { id, .. }, pod) in parents {
        let required = required_objects(pod);
        if required.too_many() {
            let why = format!(
                "references {} Secrets and ConfigMaps, more than the {MAX_OBJECTS_PER_POD} the agent watches for one pod",
                required.len()
            );
            over.insert(id.clone(), why);
            continue;
        }
        let ns: &str = &id.namespace;
        let new: Vec<(&str, bool, String)> = (required.secrets.into_iter().map(|n| (ns, true, n)))
            .chain(required.config_maps.into_iter().map(|n| (ns, false, n)))
            .filter(|key| !watched.contains(key))
            .collect();
        if watched.len() + new.len() > MAX_WATCHED_OBJECTS {
            let why = format!(
                "references {} Secrets and ConfigMaps not watched yet, and the agent already watches {} of the {MAX_WATCHED_OBJECTS} it watches on a node (for parents before it: its own pod, the control plane's, then the older ones)",
                new.len(),
                watched.len()
            );
            over.insert(id.clone(), why);
            continue;
        }
        watched.extend(new);
    }
    over
}

/// The Secrets and ConfigMaps (in the pod's namespace) a pod's volumes and env use.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequiredObjects {
    /// Secret names.
    pub secrets: BTreeSet<String>,
    /// ConfigMap names.
    pub config_maps: BTreeSet<String>,
}

impl RequiredObjects {
    /// How many objects, Secrets and ConfigMaps together.
    pub fn len(&self) -> usize {
        self.secrets.len() + self.config_maps.len()
    }

    /// Whether no object is needed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether this is more than one pod may reference (`MAX_OBJECTS_PER_POD`).
    pub fn too_many(&self) -> bool {
        self.len() > MAX_OBJECTS_PER_POD
    }
}

/// Containers, init containers and ephemeral containers' env, as `(field path, env, envFrom)`.
fn all_container_env(pod: &Pod) -> Vec<(String, &[EnvVar], &[EnvFromSource])> {
    fn slice<T>(v: Option<&Vec<T>>) -> &[T] {
        v.map_or(&[], Vec::as_slice)
    }
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    type EnvLists<'a> = Vec<(&'a Option<Vec<EnvVar>>, &'a Option<Vec<EnvFromSource>>)>;
    let lists: [(&str, EnvLists<'_>); 3] = [
        (
            "initContainers",
            slice(spec.init_containers.as_ref())
                .iter()
                .map(|c: &Container| (&c.env, &c.env_from))
                .collect(),
        ),
        (
            "containers",
            spec.containers.iter().map(|c| (&c.env, &c.env_from)).collect(),
        ),
        (
            "ephemeralContainers",
            slice(spec.ephemeral_containers.as_ref())
                .iter()
                .map(|c| (&c.env, &c.env_from))
                .collect(),
        ),
    ];
    let mut out = Vec::new();
    for (list, containers) in lists {
        for (i, (env, env_from)) in containers.into_iter().enumerate() {
            out.push((
                format!("spec.{list}[{i}]"),
                slice(env.as_ref()),
                slice(env_from.as_ref()),
            ));
        }
    }
    out
}

/// The Secrets and ConfigMaps a pod needs, from secret/configMap/projected volumes, env
/// `valueFrom` and `envFrom`. Fetch these, then [`crate::sanitize::sanitize`].
pub(crate) fn required_objects(pod: &Pod) -> RequiredObjects {
    let mut req = RequiredObjects::default();
    for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        if let Some(name) = v.secret.as_ref().and_then(|s| s.secret_name.clone()) {
            req.secrets.insert(name);
        }
        if let Some(cm) = &v.config_map {
            req.config_maps.insert(cm.name.clone());
        }
        for source in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(s) = &source.secret {
                req.secrets.insert(s.name.clone());
            }
            if let Some(cm) = &source.config_map {
                req.config_maps.insert(cm.name.clone());
            }
        }
    }
    for (_, env, env_from) in all_container_env(pod) {
        for e in env {
            let from = e.value_from.as_ref();
            if let Some(s) = from.and_then(|f| f.secret_key_ref.as_ref()) {
                req.secrets.insert(s.name.clone());
            }
            if let Some(cm) = from.and_then(|f| f.config_map_key_ref.as_ref()) {
                req.config_maps.insert(cm.name.clone());
            }
        }
        for f in env_from {
            if let Some(s) = &f.secret_ref {
                req.secrets.insert(s.name.clone());
            }
            if let Some(cm) = &f.config_map_ref {
                req.config_maps.insert(cm.name.clone());
            }
        }
    }
    req
}

/// Every reference to an API object in a pod, as field paths with what they refer to;
/// empty means a kubelet ≥1.34 accepts it as a static pod.
///
/// Mirrors the kubelet's `HasAPIObjectReference`: service account, secrets and config
/// maps from any source (volumes, env, envFrom, imagePullSecrets, volume secretRefs),
/// resource claims, and every volume type except those known to need no API object.
pub fn references_api_objects(pod: &Pod) -> Vec<String> {
    let mut refs = Vec::new();
    let Some(spec) = pod.spec.as_ref() else {
        return refs;
    };
    for (field, value) in [
        ("serviceAccountName", &spec.service_account_name),
        ("serviceAccount", &spec.service_account),
    ] {
        if value.as_deref().is_some_and(|v| !v.is_empty()) {
            refs.push(format!("spec.{field}: serviceaccounts"));
        }
    }
    if spec.image_pull_secrets.as_ref().is_some_and(|s| !s.is_empty()) {
        refs.push("spec.imagePullSecrets: secrets".to_owned());
    }
    if spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty()) {
        refs.push("spec.resourceClaims: resourceclaims".to_owned());
    }
    for (path, env, env_from) in all_container_env(pod) {
        for (i, e) in env.iter().enumerate() {
            let from = e.value_from.as_ref();
            if from.is_some_and(|f| f.secret_key_ref.is_some()) {
                refs.push(format!("{path}.env[{i}].valueFrom.secretKeyRef: secrets"));
            }
            if from.is_some_and(|f| f.config_map_key_ref.is_some()) {
                refs.push(format!("{path}.env[{i}].valueFrom.configMapKeyRef: configmaps"));
            }
        }
        for (i, f) in env_from.iter().enumerate() {
            if f.secret_ref.is_some() {
                refs.push(format!("{path}.envFrom[{i}].secretRef: secrets"));
            }
            if f.config_map_ref.is_some() {
                refs.push(format!("{path}.envFrom[{i}].configMapRef: configmaps"));
            }
        }
    }
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        if let Some(what) = volume_reference(v) {
            refs.push(format!("spec.volumes[{i}] ({}): {what}", v.name));
        }
    }
    refs
}

/// What a volume refers to in the API, if anything.
fn volume_reference(v: &Volume) -> Option<&'static str> {
    let secret_ref = v.cephfs.as_ref().is_some_and(|s| s.secret_ref.is_some())
        || v.cinder.as_ref().is_some_and(|s| s.secret_ref.is_some())
        || v.flex_volume.as_ref().is_some_and(|s| s.secret_ref.is_some())
        || v.iscsi.as_ref().is_some_and(|s| s.secret_ref.is_some())
        || v.rbd.as_ref().is_some_and(|s| s.secret_ref.is_some())
        || v.scale_io.is_some()
        || v.storageos.as_ref().is_some_and(|s| s.secret_ref.is_some());
    if secret_ref {
        return Some("secrets (via the volume's secretRef)");
    }
    let needs_no_api = v.aws_elastic_block_store.is_some()
        || v.azure_disk.is_some()
        || v.cephfs.is_some()
        || v.cinder.is_some()
        || v.downward_api.is_some()
        || v.empty_dir.is_some()
        || v.fc.is_some()
        || v.flex_volume.is_some()
        || v.flocker.is_some()
        || v.gce_persistent_disk.is_some()
        || v.git_repo.is_some()
        || v.host_path.is_some()
        || v.image.is_some()
        || v.iscsi.is_some()
        || v.nfs.is_some()
        || v.photon_persistent_disk.is_some()
        || v.portworx_volume.is_some()
        || v.quobyte.is_some()
        || v.rbd.is_some()
        || v.storageos.is_some()
        || v.vsphere_volume.is_some();
    if needs_no_api {
        return None;
    }
    if v.config_map.is_some() {
        return Some("configmaps (via configmap volumes)");
    }
    if v.secret.is_some() {
        return Some("secrets (via secret volumes)");
    }
    if v.csi.is_some() {
        return Some("csidrivers (via CSI volumes)");
    }
    if v.glusterfs.is_some() {
        return Some("endpoints (via glusterFS volumes)");
    }
    if v.persistent_volume_claim.is_some() {
        return Some("persistentvolumeclaims");
    }
    if v.ephemeral.is_some() {
        return Some("persistentvolumeclaims (via ephemeral volumes)");
    }
    if v.azure_file.is_some() {
        return Some("secrets (via azureFile volumes)");
    }
    if let Some(p) = &v.projected {
        for s in p.sources.iter().flatten() {
            if s.config_map.is_some() {
                return Some("configmaps (via projected volumes)");
            }
            if s.secret.is_some() {
                return Some("secrets (via projected volumes)");
            }
            if s.service_account_token.is_some() {
                return Some("serviceaccounts (via projected volumes)");
            }
            if s.cluster_trust_bundle.is_some() {
                return Some("clustertrustbundles");
            }
            if s.downward_api.is_none() {
                return Some("an unknown projected volume source");
            }
        }
        return None;
    }
    // No source at all: the API's defaults, which the kubelet applies to a static pod
    // before this check, make it an emptyDir.
    let names_only = serde_json::to_value(v)
        .ok()
        .and_then(|json| json.as_object().map(|fields| fields.keys().all(|k| k == "name")));
    if names_only == Some(true) {
        return None;
    }
    Some("an unknown volume type")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A parent: `ns/name`, created `created` seconds after the epoch (`None`: no time),
    /// labelled `tier: control-plane` or not, referencing Secrets `s<first>..s<last>`.
    struct Parent {
        id: &'static str,
        created: Option<u64>,
        control_plane_label: bool,
        secrets: std::ops::Range<usize>,
    }

    fn parent(id: &'static str, created: Option<u64>, secrets: std::ops::Range<usize>) -> Parent {
        Parent {
            id,
            created,
            control_plane_label: false,
            secrets,
        }
    }

    fn pod(p: &Parent) -> (PodId, Pod) {
        let (ns, name) = p.id.split_once('/').unwrap();
        let env: Vec<serde_json::Value> = (p.secrets.clone())
            .map(|i| json!({"name": format!("E{i}"), "valueFrom": {"secretKeyRef": {"name": format!("s{i}"), "key": "k"}}}))
            .collect();
        let created = p
            .created
            .map(|s| jiff::Timestamp::from_second(s as i64).unwrap().to_string());
        let labels = p.control_plane_label.then(|| json!({"tier": "control-plane"}));
        let pod = serde_json::from_value(json!({
            "metadata": {"namespace": ns, "name": name, "creationTimestamp": created, "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "i", "env": env}]},
        }))
        .unwrap();
        (PodId::new(ns, name), pod)
    }

    /// The agent is `ckpt/agent`; the output, the parents refused (`ns/name`).
    fn check(input: &[Parent], expected: &[&str]) {
        let pods: Vec<(PodId, Pod)> = input.iter().map(pod).collect();
        let me = SelfIdentity::new("ckpt", "agent", "node-1");
        let over = over_watch_budget(pods.iter().map(|(id, pod)| (id, pod)), &me);
        let refused: Vec<String> = over
            .keys()
            .map(|id| format!("{}/{}", id.namespace, id.name))
            .collect();
        let ids: Vec<&str> = input.iter().map(|p| p.id).collect();
        assert_eq!(refused, expected, "{ids:?}");
    }

    #[test]
    fn the_watch_budget_goes_to_the_agent_the_control_plane_then_the_oldest() {
        const PER_POD: usize = MAX_OBJECTS_PER_POD;
        // Four parents of 64 objects each fill the node's 256.
        let full = |ns: &'static [&'static str; 4], created: u64| -> Vec<Parent> {
            (0..4)
                .map(|i| parent(ns[i], Some(created + i as u64), i * PER_POD..(i + 1) * PER_POD))
                .collect()
        };
        let apps = &["apps/b0", "apps/b1", "apps/b2", "apps/b3"];
        let with = |mut parents: Vec<Parent>, more: Parent| {
            parents.push(more);
            parents
        };
        let cases: Vec<(&str, Vec<Parent>, &[&str])> = vec![
            ("within the budget", full(apps, 100), &[]),
            (
                "a new parent that sorts first by name is the one refused",
                with(full(apps, 100), parent("apps/a-new", Some(200), 1000..1001)),
                &["apps/a-new"],
            ),
            (
                "among parents as old, by namespace and name",
                with(full(apps, 100), parent("apps/a-new", Some(100), 1000..1001)),
                &["apps/b3"],
            ),
            (
                "a parent with no creation time goes last",
                with(full(apps, 100), parent("apps/a-new", None, 1000..1001)),
                &["apps/a-new"],
            ),
            (
                "a control-plane pod, even a newer one, before the workloads",
                with(
                    full(apps, 100),
                    parent("kube-system/kube-apiserver", Some(300), 1000..1010),
                ),
                &["apps/b3"],
            ),
            (
                "labelled control-plane elsewhere",
                with(
                    full(apps, 100),
                    Parent {
                        control_plane_label: true,
                        ..parent("infra/scheduler", Some(300), 1000..1001)
                    },
                ),
                &["apps/b3"],
            ),
            (
                "the agent's own pod first of all",
                with(
                    full(
                        &[
                            "kube-system/a0",
                            "kube-system/a1",
                            "kube-system/a2",
                            "kube-system/a3",
                        ],
                        100,
                    ),
                    parent("ckpt/agent", Some(400), 1000..1001),
                ),
                &["kube-system/a3"],
            ),
            (
                "objects already watched cost nothing",
                with(full(apps, 100), parent("apps/a-shared", Some(200), 0..PER_POD)),
                &[],
            ),
            (
                "too many for one pod, whatever its place",
                vec![
                    parent("kube-system/big", Some(1), 0..PER_POD + 1),
                    parent("apps/small", Some(2), 2000..2001),
                ],
                &["kube-system/big"],
            ),
        ];
        for (name, input, expected) in cases {
            eprintln!("case: {name}");
            check(&input, expected);
        }
    }
}
