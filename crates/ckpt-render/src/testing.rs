//! Reading a rendered install back, for tests (feature `testing`): its DaemonSet, pod,
//! container and ConfigMaps, and its YAML parsed into [`Manifest`]s again.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::api::rbac::v1::PolicyRule;

use crate::objects::CONFIG_KEY;
use crate::{Manifest, ManifestArgs, NAME};

/// Flags that read the kubelet's `/pods` instead of the CRI, its certificate unverified.
pub fn kubelet_args() -> ManifestArgs {
    ManifestArgs {
        runtime_endpoint: String::new(),
        kubelet_insecure: true,
        ..ManifestArgs::default()
    }
}

pub fn daemonset_of(objects: &[Manifest]) -> &DaemonSet {
    objects
        .iter()
        .find_map(|o| match o {
            Manifest::DaemonSet(ds) => Some(ds.as_ref()),
            _ => None,
        })
        .expect("a DaemonSet")
}

pub fn pod_spec_of(objects: &[Manifest]) -> &PodSpec {
    daemonset_of(objects).spec.template.spec.as_ref().unwrap()
}

pub fn container_of(objects: &[Manifest]) -> &Container {
    &pod_spec_of(objects).containers[0]
}

pub fn config_map_of<'a>(objects: &'a [Manifest], name: &str, key: &str) -> Option<&'a str> {
    objects.iter().find_map(|o| match o {
        Manifest::ConfigMap(cm) if cm.metadata.name.as_deref() == Some(name) => {
            cm.data.as_ref()?.get(key).map(String::as_str)
        }
        _ => None,
    })
}

pub fn config_of(objects: &[Manifest]) -> &str {
    config_map_of(objects, NAME, CONFIG_KEY).expect("the agent's ConfigMap")
}

pub fn cluster_rules<'a>(objects: &'a [Manifest], name: &str) -> Option<&'a [PolicyRule]> {
    objects.iter().find_map(|o| match o {
        Manifest::ClusterRole(r) if r.metadata.name.as_deref() == Some(name) => r.rules.as_deref(),
        _ => None,
    })
}

/// Parses what [`to_yaml`](crate::to_yaml) wrote, each document by its `kind`.
pub fn from_yaml(text: &str) -> std::result::Result<Vec<Manifest>, String> {
    let documents: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(text).map_err(|e| format!("not a multi-document YAML stream: {e}"))?;
    documents
        .into_iter()
        .enumerate()
        .map(|(index, doc)| manifest_from_json(doc).map_err(|e| format!("document {}: {e}", index + 1)))
        .collect()
}

/// One document, by its `kind`.
pub fn manifest_from_json(value: serde_json::Value) -> std::result::Result<Manifest, String> {
    let kind = value
        .get("kind")
        .and_then(|k| k.as_str())
        .unwrap_or_default()
        .to_owned();
    let parsed = match kind.as_str() {
        "Namespace" => serde_json::from_value(value).map(Manifest::Namespace),
        "ServiceAccount" => serde_json::from_value(value).map(Manifest::ServiceAccount),
        "ConfigMap" => serde_json::from_value(value).map(Manifest::ConfigMap),
        "ClusterRole" => serde_json::from_value(value).map(Manifest::ClusterRole),
        "ClusterRoleBinding" => serde_json::from_value(value).map(Manifest::ClusterRoleBinding),
        "Role" => serde_json::from_value(value).map(Manifest::Role),
        "RoleBinding" => serde_json::from_value(value).map(Manifest::RoleBinding),
        "DaemonSet" => serde_json::from_value(value).map(|ds| Manifest::DaemonSet(Box::new(ds))),
        other => return Err(format!("unexpected kind {other:?}")),
    };
    parsed.map_err(|e| format!("invalid {kind}: {e}"))
}

pub fn kinds_and_names(objects: &[Manifest]) -> Vec<String> {
    objects.iter().map(Manifest::describe).collect()
}
