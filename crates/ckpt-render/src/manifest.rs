//! [`Manifest`]: one object of the install.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use serde::Serialize;

/// One object of the install, in apply order.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Manifest {
    Namespace(Namespace),
    ServiceAccount(ServiceAccount),
    ConfigMap(ConfigMap),
    ClusterRole(ClusterRole),
    ClusterRoleBinding(ClusterRoleBinding),
    Role(Role),
    RoleBinding(RoleBinding),
    /// Boxed: it is several times the size of the others.
    DaemonSet(Box<DaemonSet>),
    /// `--prometheus`: the Prometheus operator's PodMonitor and PrometheusRule (custom
    /// resources, so untyped).
    Monitoring(Box<DynamicObject>),
}

impl Manifest {
    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            Manifest::Namespace(o) => &o.metadata,
            Manifest::ServiceAccount(o) => &o.metadata,
            Manifest::ConfigMap(o) => &o.metadata,
            Manifest::ClusterRole(o) => &o.metadata,
            Manifest::ClusterRoleBinding(o) => &o.metadata,
            Manifest::Role(o) => &o.metadata,
            Manifest::RoleBinding(o) => &o.metadata,
            Manifest::DaemonSet(o) => &o.metadata,
            Manifest::Monitoring(o) => &o.metadata,
        }
    }

    pub fn name(&self) -> &str {
        self.metadata().name.as_deref().unwrap_or_default()
    }

    pub fn namespace(&self) -> Option<&str> {
        self.metadata().namespace.as_deref()
    }

    /// Group, version, kind and plural, for a dynamic API client.
    pub fn api_resource(&self) -> ApiResource {
        match self {
            Manifest::Namespace(_) => ApiResource::erase::<Namespace>(&()),
            Manifest::ServiceAccount(_) => ApiResource::erase::<ServiceAccount>(&()),
            Manifest::ConfigMap(_) => ApiResource::erase::<ConfigMap>(&()),
            Manifest::ClusterRole(_) => ApiResource::erase::<ClusterRole>(&()),
            Manifest::ClusterRoleBinding(_) => ApiResource::erase::<ClusterRoleBinding>(&()),
            Manifest::Role(_) => ApiResource::erase::<Role>(&()),
            Manifest::RoleBinding(_) => ApiResource::erase::<RoleBinding>(&()),
            Manifest::DaemonSet(_) => ApiResource::erase::<DaemonSet>(&()),
            Manifest::Monitoring(o) => {
                let types = o.types.clone().unwrap_or_default();
                let (group, version) = types
                    .api_version
                    .split_once('/')
                    .unwrap_or(("", &types.api_version));
                ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &types.kind))
            }
        }
    }

    /// `DaemonSet kube-system/pod-checkpointer`, `ClusterRole pod-checkpointer`.
    pub fn describe(&self) -> String {
        let kind = self.api_resource().kind;
        match self.namespace() {
            Some(ns) => format!("{kind} {ns}/{}", self.name()),
            None => format!("{kind} {}", self.name()),
        }
    }

    /// The RBAC rules of a role, `None` for other objects.
    pub fn rules(&self) -> Option<&[PolicyRule]> {
        match self {
            Manifest::ClusterRole(r) => r.rules.as_deref(),
            Manifest::Role(r) => r.rules.as_deref(),
            _ => None,
        }
    }
}
