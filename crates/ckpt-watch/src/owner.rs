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
        f.debug_struct("OwnerLookup")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::testkit::{FakeApi, status_body};

    fn owner(api_version: &str, kind: &str, name: &str) -> ControllerOwner {
        ControllerOwner {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: "uid-1".into(),
        }
    }

    #[tokio::test]
    async fn present_absent_and_unknown() {
        let (client, fake, _server) = FakeApi::start();
        let ds = json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
                        "metadata": {"name": "api", "namespace": "ks", "uid": "uid-other"}});
        fake.set_get("/apis/apps/v1/namespaces/ks/daemonsets/api", 200, ds);
        fake.set_get(
            "/apis/batch/v1/namespaces/ks/jobs/gone",
            404,
            status_body(404, "not found"),
        );
        fake.set_get(
            "/apis/apps/v1/namespaces/ks/replicasets/secret",
            403,
            status_body(403, "forbidden"),
        );
        fake.set_get("/apis/apps/v1/namespaces/ks/statefulsets/hung", 0, json!(null));
        let lookup = OwnerLookup::new(client, Duration::from_millis(200));

        // Same name, other UID: the re-created controller still counts (see the docs).
        assert_eq!(
            lookup
                .owner_status("ks", &owner("apps/v1", "DaemonSet", "api"))
                .await,
            OwnerPresence::Present
        );
        assert_eq!(
            lookup.owner_status("ks", &owner("batch/v1", "Job", "gone")).await,
            OwnerPresence::Absent
        );
        let OwnerPresence::Unknown(why) = lookup
            .owner_status("ks", &owner("apps/v1", "ReplicaSet", "secret"))
            .await
        else {
            panic!("a 403 is not an answer");
        };
        assert!(why.contains("replicasets ks/secret"), "{why}");
        let OwnerPresence::Unknown(why) = lookup
            .owner_status("ks", &owner("apps/v1", "StatefulSet", "hung"))
            .await
        else {
            panic!("a hung GET is not an answer");
        };
        assert!(why.contains("timed out"), "{why}");
        assert!(matches!(
            lookup.owner_status("ks", &owner("", "DaemonSet", "x")).await,
            OwnerPresence::Unknown(_)
        ));
        assert!(fake.log().iter().all(|s| s.method == "GET"));
    }
}
