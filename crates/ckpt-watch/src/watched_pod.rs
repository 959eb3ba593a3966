//! A pod as the API server sent it, read into the typed model, with the fields that model
//! does not know.
//!
//! The agent reads pods with k8s-openapi's newest version feature; a pod from a newer API
//! server can carry fields that model does not have, which serde drops without a word. A
//! checkpoint written from such a pod would run without them: a silent change of what the
//! node runs. So every pod is read twice over, once as JSON and once typed, and the
//! `spec`/`metadata` paths the typed pod lost are kept beside it ([`WatchedPod`]); the
//! planner refuses to checkpoint a pod that lost any (`ckpt_core`'s
//! `Observation::unknown_fields`).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// A pod and the paths of what the typed model dropped from it.
#[derive(Clone, Debug)]
pub struct WatchedPod {
    pub pod: Arc<Pod>,
    /// `spec.containers[0].futureField`: empty unless the API server is newer than the
    /// model.
    pub unknown_fields: Arc<[String]>,
}

impl WatchedPod {
    /// Reads `raw` (a pod's JSON) into the model; keeps the `spec` and `metadata` paths it
    /// drops (a pod's `status` is never checkpointed).
    pub fn from_json(raw: &Value) -> Result<WatchedPod, serde_json::Error> {
        let pod = Pod::deserialize(raw)?;
        let typed = serde_json::to_value(&pod)?;
        let mut unknown = Vec::new();
        for field in ["metadata", "spec"] {
            if let (Some(raw), Some(typed)) = (raw.get(field), typed.get(field)) {
                dropped_paths(raw, typed, field, &mut unknown);
            }
        }
        Ok(WatchedPod {
            pod: Arc::new(pod),
            unknown_fields: unknown.into(),
        })
    }
}

impl<'de> Deserialize<'de> for WatchedPod {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = Value::deserialize(deserializer)?;
        WatchedPod::from_json(&raw).map_err(D::Error::custom)
    }
}

impl k8s_openapi::Resource for WatchedPod {
    const API_VERSION: &'static str = <Pod as k8s_openapi::Resource>::API_VERSION;
    const GROUP: &'static str = <Pod as k8s_openapi::Resource>::GROUP;
    const KIND: &'static str = <Pod as k8s_openapi::Resource>::KIND;
    const VERSION: &'static str = <Pod as k8s_openapi::Resource>::VERSION;
    const URL_PATH_SEGMENT: &'static str = <Pod as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    type Scope = <Pod as k8s_openapi::Resource>::Scope;
}

impl k8s_openapi::Metadata for WatchedPod {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.pod.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        // Unshared right after a read, where the watch changes it.
        &mut Arc::make_mut(&mut self.pod).metadata
    }
}

/// The paths under `at` present (and not null) in `raw` but missing from `typed`.
fn dropped_paths(raw: &Value, typed: &Value, at: &str, out: &mut Vec<String>) {
    match (raw, typed) {
        (Value::Object(raw), Value::Object(typed)) => {
            for (key, value) in raw.iter().filter(|(_, v)| !v.is_null()) {
                let path = format!("{at}.{key}");
                match typed.get(key) {
                    Some(kept) => dropped_paths(value, kept, &path, out),
                    None => out.push(path),
                }
            }
        }
        (Value::Array(raw), Value::Array(typed)) => {
            for (i, (value, kept)) in raw.iter().zip(typed).enumerate() {
                dropped_paths(value, kept, &format!("{at}[{i}]"), out);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn check(pod: Value, expected: &[&str]) {
        let watched: WatchedPod = serde_json::from_value(pod).expect("a pod");
        assert_eq!(&*watched.unknown_fields, expected);
    }

    #[test]
    fn fields_the_model_does_not_know_are_named() {
        let container = |extra: Value| {
            let mut c = json!({ "name": "c", "image": "i", "resources": {}, "args": [] });
            c.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            c
        };
        for (pod, expected) in [
            // Everything known, empty objects and lists and nulls included.
            (
                json!({ "metadata": { "name": "p", "labels": { "a": "b" }, "ownerReferences": null },
                        "spec": { "containers": [container(json!({}))], "securityContext": {} },
                        "status": { "phase": "Running" } }),
                &[][..],
            ),
            (
                json!({ "metadata": { "name": "p" },
                        "spec": { "futureField": { "x": 1 }, "containers": [container(json!({}))] } }),
                &["spec.futureField"][..],
            ),
            (
                json!({ "metadata": { "name": "p", "futureMeta": "x" },
                        "spec": { "containers": [container(json!({})), container(json!({ "futureKnob": true }))],
                                  "volumes": [{ "name": "v", "emptyDir": { "futureLimit": "1Gi" } }] } }),
                &[
                    "metadata.futureMeta",
                    "spec.containers[1].futureKnob",
                    "spec.volumes[0].emptyDir.futureLimit",
                ][..],
            ),
            // A new status field is not a loss: status is never checkpointed.
            (
                json!({ "metadata": { "name": "p" }, "spec": { "containers": [container(json!({}))] },
                        "status": { "futureCondition": 1 } }),
                &[][..],
            ),
        ] {
            check(pod, expected);
        }
    }

    #[test]
    fn its_metadata_is_the_pods() {
        use k8s_openapi::Metadata;
        let mut watched: WatchedPod =
            serde_json::from_value(json!({ "metadata": { "name": "p", "managedFields": [] } })).unwrap();
        watched.metadata_mut().managed_fields = None;
        assert_eq!(watched.pod.metadata.name.as_deref(), Some("p"));
        assert_eq!(watched.pod.metadata.managed_fields, None);
    }
}
