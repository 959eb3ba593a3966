//! Which API objects a pod refers to: what must be fetched before sanitizing, and the
//! kubelet's (≥1.34) rule that a static pod may refer to none.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, EnvFromSource, EnvVar, Pod, Volume};

use crate::identity::PodId;

/// The most Secrets and ConfigMaps one parent may reference, together: the agent watches
/// each one (as the kubelet does), so a pod referencing more is refused, with an Event,
/// before any watch starts. A control-plane pod references a handful.
pub(crate) const MAX_OBJECTS_PER_POD: usize = 64;

/// The most Secrets and ConfigMaps the agent watches on a node, for every parent
/// together (each watch holds a connection to the API server). Parents are taken in
/// order of namespace and name; one whose objects not watched yet would go past the
/// bound is refused, with an Event, before any watch of it starts.
pub(crate) const MAX_WATCHED_OBJECTS: usize = 256;

/// The parents, of `parents` in the order given, that reference more Secrets and
/// ConfigMaps than one pod may, or whose objects not referenced by an earlier parent would
/// take the node past [`MAX_WATCHED_OBJECTS`]: nothing of them is watched.
pub(crate) fn over_watch_budget<'a, I>(parents: I) -> BTreeMap<PodId, String>
where
    I: IntoIterator<Item = (&'a PodId, &'a Pod)>,
{
    let mut watched: BTreeSet<(&str, bool, String)> = BTreeSet::new();
    let mut over = BTreeMap::new();
    for (id, pod) in parents {
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
                "references {} Secrets and ConfigMaps not watched yet, and the agent already watches {} of the {MAX_WATCHED_OBJECTS} it watches on a node (for parents before it by namespace and name)",
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
    Some("an unknown volume type")
}
