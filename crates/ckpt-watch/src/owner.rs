//! Does a pod's controller owner still exist? For the owner-reference GC strategy.

use std::time::Duration;

use ckpt_core::ControllerOwner;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};

use crate::error::error_chain;

/// Whether a controller owner exists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OwnerPresence {
    /// An object of that kind and name exists in the namespace.
    Present,
    /// The API server says there is none (404).
    Absent,
    /// Anything else (timeout, 403, connection error, a malformed owner): we do not know.
    Unknown(String),
}

/// Looks up controller owners with one `GET` each (only when the GC strategy asks, not
/// periodically).
///
/// The kind is resolved without discovery: `apiVersion` gives group and version, and the
/// plural is guessed from the kind (lowercase + `s` for the workload controllers:
/// `daemonsets`, `replicasets`, `statefulsets`, `deployments`, `jobs`, `cronjobs`,
/// `replicationcontrollers`), which is right for every built-in controller.
///
/// An object with the same kind and name but a different UID counts as
/// [`OwnerPresence::Present`]: a controller deleted and re-created under the same name
/// manages the same workload (as [`ControllerOwner::same_controller`] and the
/// owner-reference strategy define it), so its old pods' checkpoints fall back to the
/// grace period instead of being removed at once.
#[derive(Clone)]
pub struct OwnerLookup {
    client: kube::Client,
    timeout: Duration,
}

impl std::fmt::Debug for OwnerLookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnerLookup").field("timeout", &self.timeout).finish_non_exhaustive()
    }
}

impl OwnerLookup {
    /// A lookup whose every request is bounded by `timeout`.
    pub fn new(client: kube::Client, timeout: Duration) -> Self {
        Self { client, timeout }
    }

    /// Whether `owner` exists in `namespace`.
    pub async fn owner_status(&self, namespace: &str, owner: &ControllerOwner) -> OwnerPresence {
        let (group, version) = match owner.api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", owner.api_version.as_str()),
        };
        if version.is_empty() || owner.kind.is_empty() || owner.name.is_empty() {
            return OwnerPresence::Unknown(format!("malformed owner reference {}", owner.to_annotation()));
        }
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &owner.kind));
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), namespace, &resource);
        let what = format!("{} {namespace}/{}", resource.plural, owner.name);
        match tokio::time::timeout(self.timeout, api.get_opt(&owner.name)).await {
            Err(_) => OwnerPresence::Unknown(format!("GET {what} timed out after {:?}", self.timeout)),
            Ok(Err(err)) => OwnerPresence::Unknown(format!("GET {what} failed: {}", error_chain(&err))),
            Ok(Ok(None)) => OwnerPresence::Absent,
            Ok(Ok(Some(_))) => OwnerPresence::Present,
        }
    }
}
