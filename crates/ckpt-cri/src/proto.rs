//! The CRI messages the agent, the fake runtime and the e2e harness use, hand-written
//! with `prost` so no `protoc` is needed.
//!
//! Field numbers and wire types follow `k8s.io/cri-api`'s
//! `pkg/apis/runtime/v1/api.proto` and `pkg/apis/runtime/v1alpha2/api.proto`, which agree
//! on every message here, so one set of structs serves both packages (the `tests` module
//! checks each one against bytes derived by hand from those files). Fields nobody reads
//! are left out: prost skips unknown fields when decoding. Enums are plain `int32`
//! constants on the wire.

use std::collections::BTreeMap;

/// `PodSandboxState.SANDBOX_READY`.
pub const SANDBOX_READY: i32 = 0;
/// `PodSandboxState.SANDBOX_NOTREADY`.
pub const SANDBOX_NOTREADY: i32 = 1;
/// `ContainerState.CONTAINER_CREATED`.
pub const CONTAINER_CREATED: i32 = 0;
/// `ContainerState.CONTAINER_RUNNING`.
pub const CONTAINER_RUNNING: i32 = 1;
/// `ContainerState.CONTAINER_EXITED`.
pub const CONTAINER_EXITED: i32 = 2;
/// `ContainerState.CONTAINER_UNKNOWN`.
pub const CONTAINER_UNKNOWN: i32 = 3;

/// The label the kubelet puts a pod's namespace in (on its sandboxes and containers).
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// The label the kubelet puts a pod's name in (on its sandboxes and containers).
pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";

/// `VersionRequest`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct VersionRequest {
    /// The kubelet's runtime API version.
    #[prost(string, tag = "1")]
    pub version: String,
}

/// `VersionResponse`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct VersionResponse {
    /// The kubelet runtime API version.
    #[prost(string, tag = "1")]
    pub version: String,
    /// The runtime's name, e.g. `containerd`.
    #[prost(string, tag = "2")]
    pub runtime_name: String,
    /// The runtime's version.
    #[prost(string, tag = "3")]
    pub runtime_version: String,
    /// The runtime's API version.
    #[prost(string, tag = "4")]
    pub runtime_api_version: String,
}

/// `PodSandboxMetadata`: the pod a sandbox belongs to.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct PodSandboxMetadata {
    /// The pod's name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// The pod's UID.
    #[prost(string, tag = "2")]
    pub uid: String,
    /// The pod's namespace.
    #[prost(string, tag = "3")]
    pub namespace: String,
    /// Which attempt at creating the sandbox this is.
    #[prost(uint32, tag = "4")]
    pub attempt: u32,
}

/// `PodSandboxStateValue`: a [`SANDBOX_READY`] / [`SANDBOX_NOTREADY`] wrapper for filters.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct PodSandboxStateValue {
    /// The state.
    #[prost(int32, tag = "1")]
    pub state: i32,
}

/// `PodSandboxFilter`: every set field must match.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct PodSandboxFilter {
    /// The sandbox ID.
    #[prost(string, tag = "1")]
    pub id: String,
    /// The sandbox state.
    #[prost(message, optional, tag = "2")]
    pub state: Option<PodSandboxStateValue>,
    /// Labels the sandbox must have.
    #[prost(btree_map = "string, string", tag = "3")]
    pub label_selector: BTreeMap<String, String>,
}

/// `ListPodSandboxRequest`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ListPodSandboxRequest {
    /// No filter: every sandbox.
    #[prost(message, optional, tag = "1")]
    pub filter: Option<PodSandboxFilter>,
}

/// `PodSandbox`: a pod's sandbox as listed.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct PodSandbox {
    /// The sandbox ID.
    #[prost(string, tag = "1")]
    pub id: String,
    /// The pod it belongs to.
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<PodSandboxMetadata>,
    /// [`SANDBOX_READY`] or [`SANDBOX_NOTREADY`].
    #[prost(int32, tag = "3")]
    pub state: i32,
    /// Creation time, nanoseconds since the epoch.
    #[prost(int64, tag = "4")]
    pub created_at: i64,
    /// Labels.
    #[prost(btree_map = "string, string", tag = "5")]
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    #[prost(btree_map = "string, string", tag = "6")]
    pub annotations: BTreeMap<String, String>,
}

/// `ListPodSandboxResponse`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ListPodSandboxResponse {
    /// The sandboxes.
    #[prost(message, repeated, tag = "1")]
    pub items: Vec<PodSandbox>,
}

/// `ContainerMetadata`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ContainerMetadata {
    /// The container's name in the pod spec.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Which attempt at creating the container this is.
    #[prost(uint32, tag = "2")]
    pub attempt: u32,
}

/// `ContainerStateValue`: a `CONTAINER_*` wrapper for filters.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ContainerStateValue {
    /// The state.
    #[prost(int32, tag = "1")]
    pub state: i32,
}

/// `ContainerFilter`: every set field must match.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ContainerFilter {
    /// The container ID.
    #[prost(string, tag = "1")]
    pub id: String,
    /// The container state.
    #[prost(message, optional, tag = "2")]
    pub state: Option<ContainerStateValue>,
    /// The sandbox ID.
    #[prost(string, tag = "3")]
    pub pod_sandbox_id: String,
    /// Labels the container must have.
    #[prost(btree_map = "string, string", tag = "4")]
    pub label_selector: BTreeMap<String, String>,
}

/// `ListContainersRequest`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ListContainersRequest {
    /// No filter: every container.
    #[prost(message, optional, tag = "1")]
    pub filter: Option<ContainerFilter>,
}

/// `Container`: a container as listed (field 4, the image spec, is not read).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Container {
    /// The container ID.
    #[prost(string, tag = "1")]
    pub id: String,
    /// The sandbox it runs in.
    #[prost(string, tag = "2")]
    pub pod_sandbox_id: String,
    /// Its name.
    #[prost(message, optional, tag = "3")]
    pub metadata: Option<ContainerMetadata>,
    /// The image it runs.
    #[prost(string, tag = "5")]
    pub image_ref: String,
    /// One of the `CONTAINER_*` states.
    #[prost(int32, tag = "6")]
    pub state: i32,
    /// Creation time, nanoseconds since the epoch.
    #[prost(int64, tag = "7")]
    pub created_at: i64,
    /// Labels (the kubelet's include [`LABEL_POD_NAMESPACE`] and [`LABEL_POD_NAME`]).
    #[prost(btree_map = "string, string", tag = "8")]
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    #[prost(btree_map = "string, string", tag = "9")]
    pub annotations: BTreeMap<String, String>,
}

/// `ListContainersResponse`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ListContainersResponse {
    /// The containers.
    #[prost(message, repeated, tag = "1")]
    pub containers: Vec<Container>,
}

/// `StopContainerRequest`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct StopContainerRequest {
    /// The container ID.
    #[prost(string, tag = "1")]
    pub container_id: String,
    /// Seconds of grace before the container is killed (0: at once).
    #[prost(int64, tag = "2")]
    pub timeout: i64,
}

/// `StopContainerResponse`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct StopContainerResponse {}

/// `StopPodSandboxRequest`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct StopPodSandboxRequest {
    /// The sandbox ID.
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
}

/// `StopPodSandboxResponse`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct StopPodSandboxResponse {}

impl PodSandbox {
    /// The pod's `(namespace, name)`: from the metadata, else from the kubelet's labels.
    pub fn pod(&self) -> Option<(&str, &str)> {
        match &self.metadata {
            Some(m) if !m.name.is_empty() && !m.namespace.is_empty() => {
                Some((m.namespace.as_str(), m.name.as_str()))
            }
            _ => labels_pod(&self.labels),
        }
    }
}

impl Container {
    /// The pod's `(namespace, name)` from the kubelet's labels.
    pub fn pod(&self) -> Option<(&str, &str)> {
        labels_pod(&self.labels)
    }
}

fn labels_pod(labels: &BTreeMap<String, String>) -> Option<(&str, &str)> {
    let namespace = labels.get(LABEL_POD_NAMESPACE).filter(|v| !v.is_empty())?;
    let name = labels.get(LABEL_POD_NAME).filter(|v| !v.is_empty())?;
    Some((namespace.as_str(), name.as_str()))
}

#[cfg(test)]
mod tests;
