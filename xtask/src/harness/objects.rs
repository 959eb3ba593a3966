//! The Kubernetes objects the scenarios and the demo create, as JSON for kubectl: pods bound
//! to the hollow node (no scheduler runs), their Secrets and ConfigMaps, DaemonSet objects to
//! own them (no controller-manager runs either, so the pods are created by hand with
//! ownerReferences), and the agent's RBAC.

use anyhow::Context;
use serde_json::{Value, json};

/// The opt-in annotation of a parent pod.
pub const CHECKPOINT_ANNOTATION: &str = "checkpointer.alpha.coreos.com/checkpoint";
/// The annotation of a checkpoint naming its parent.
pub const CHECKPOINT_OF_ANNOTATION: &str = "checkpointer.alpha.coreos.com/checkpoint-of";

/// The user the agent's kubeconfig (`kubeconfig-agent`) authenticates as.
pub const AGENT_USER: &str = "pod-checkpointer";

/// An image that is never pulled: the hollow kubelet's runtime is fake.
const IMAGE: &str = "registry.invalid/pod-checkpointer-e2e:1";

pub fn namespace(name: &str) -> Value {
    json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": name } })
}

/// A Secret with `data` as `stringData`.
pub fn secret(namespace: &str, name: &str, data: &[(&str, &str)]) -> Value {
    let data: serde_json::Map<String, Value> =
        data.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect();
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": name, "namespace": namespace },
        "stringData": data,
    })
}

pub fn config_map(namespace: &str, name: &str, data: &[(&str, &str)]) -> Value {
    let data: serde_json::Map<String, Value> =
        data.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect();
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": name, "namespace": namespace },
        "data": data,
    })
}

/// A DaemonSet object; nothing turns it into pods here, it only owns the pods a test creates.
pub fn daemon_set(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": { "name": name, "namespace": namespace },
        "spec": {
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": { "containers": [ { "name": "main", "image": IMAGE } ] },
            },
        },
    })
}

/// A controller owner to put in a pod's `ownerReferences`.
#[derive(Clone, Debug)]
pub struct Owner {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
}

impl Owner {
    /// The owner reference to `object` as the API server returned it (it needs the uid).
    pub fn of(object: &Value) -> anyhow::Result<Owner> {
        let field = |value: &Value, what: &str| -> anyhow::Result<String> {
            value
                .as_str()
                .map(str::to_owned)
                .with_context(|| format!("the owner object has no {what}"))
        };
        Ok(Owner {
            api_version: field(&object["apiVersion"], "apiVersion")?,
            kind: field(&object["kind"], "kind")?,
            name: field(&object["metadata"]["name"], "metadata.name")?,
            uid: field(&object["metadata"]["uid"], "metadata.uid")?,
        })
    }
}

/// A pod bound to a node, built step by step.
#[derive(Clone, Debug)]
pub struct PodBuilder {
    namespace: String,
    name: String,
    node: String,
    checkpoint: bool,
    restart_never: bool,
    secrets: Vec<String>,
    config_maps: Vec<String>,
    owner: Option<Owner>,
    labels: Vec<(String, String)>,
}

impl PodBuilder {
    /// A one-container pod `namespace/name` bound to `node` (no scheduler runs).
    pub fn new(namespace: &str, name: &str, node: &str) -> PodBuilder {
        PodBuilder {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            node: node.to_owned(),
            checkpoint: false,
            restart_never: false,
            secrets: Vec::new(),
            config_maps: Vec::new(),
            owner: None,
            labels: Vec::new(),
        }
    }

    /// With the annotation that opts it into checkpointing.
    pub fn checkpointed(mut self) -> PodBuilder {
        self.checkpoint = true;
        self
    }

    /// `restartPolicy: Never`, so a container stopped through the CRI stays dead, like a
    /// crashed one whose restart nobody can schedule.
    pub fn restart_never(mut self) -> PodBuilder {
        self.restart_never = true;
        self
    }

    /// Mounts Secret `name` at `/etc/secrets/<name>`.
    pub fn mount_secret(mut self, name: &str) -> PodBuilder {
        self.secrets.push(name.to_owned());
        self
    }

    /// Mounts ConfigMap `name` at `/etc/config/<name>`.
    pub fn mount_config_map(mut self, name: &str) -> PodBuilder {
        self.config_maps.push(name.to_owned());
        self
    }

    /// Controlled by `owner` (an ownerReference with `controller: true`).
    pub fn owned_by(mut self, owner: &Owner) -> PodBuilder {
        self.owner = Some(owner.clone());
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> PodBuilder {
        self.labels.push((key.to_owned(), value.to_owned()));
        self
    }

    pub fn build(&self) -> Value {
        let mut volumes = Vec::new();
        let mut mounts = Vec::new();
        for (i, name) in self.secrets.iter().enumerate() {
            volumes.push(json!({ "name": format!("secret-{i}"), "secret": { "secretName": name } }));
            mounts.push(json!({ "name": format!("secret-{i}"), "mountPath": format!("/etc/secrets/{name}"), "readOnly": true }));
        }
        for (i, name) in self.config_maps.iter().enumerate() {
            volumes.push(json!({ "name": format!("config-{i}"), "configMap": { "name": name } }));
            mounts.push(json!({ "name": format!("config-{i}"), "mountPath": format!("/etc/config/{name}"), "readOnly": true }));
        }
        let mut metadata = json!({ "name": self.name, "namespace": self.namespace });
        if self.checkpoint {
            metadata["annotations"] = json!({ CHECKPOINT_ANNOTATION: "true" });
        }
        if !self.labels.is_empty() {
            let labels: serde_json::Map<String, Value> =
                self.labels.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
            metadata["labels"] = Value::Object(labels);
        }
        if let Some(owner) = &self.owner {
            metadata["ownerReferences"] = json!([{
                "apiVersion": owner.api_version, "kind": owner.kind, "name": owner.name,
                "uid": owner.uid, "controller": true, "blockOwnerDeletion": true,
            }]);
        }
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": metadata,
            "spec": {
                "nodeName": self.node,
                "restartPolicy": if self.restart_never { "Never" } else { "Always" },
                "containers": [ { "name": "main", "image": IMAGE, "volumeMounts": mounts } ],
                "volumes": volumes,
            },
        })
    }
}

/// One RBAC rule: API group, resources, verbs.
type Rule = (&'static str, &'static [&'static str], &'static [&'static str]);

/// What the agent needs, and nothing more: its pods (watch per allowed namespace), the
/// Secrets and ConfigMaps they mount, Events about them (both APIs: kube's recorder writes
/// `events.k8s.io`), and `get` on the controllers that may own a parent (owner-reference GC
/// and self-GC). Issue 8's deploy manifests render the same rules.
pub const AGENT_RULES: &[Rule] = &[
    ("", &["pods"], &["get", "list", "watch"]),
    ("", &["secrets"], &["get", "list", "watch"]),
    ("", &["configmaps"], &["get", "list", "watch"]),
    ("", &["events"], &["create", "patch"]),
    ("events.k8s.io", &["events"], &["create", "patch"]),
    (
        "apps",
        &["daemonsets", "replicasets", "statefulsets", "deployments"],
        &["get"],
    ),
];

/// A ClusterRole with `rules`, for RoleBindings in each namespace the agent may checkpoint.
pub fn cluster_role(name: &str, rules: &[Rule]) -> Value {
    let rules: Vec<Value> = rules
        .iter()
        .map(|(group, resources, verbs)| json!({ "apiGroups": [group], "resources": resources, "verbs": verbs }))
        .collect();
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": { "name": name },
        "rules": rules,
    })
}

/// `rules` without the rule(s) on `resource`: the same role with one permission missing.
pub fn rules_without(rules: &[Rule], resource: &str) -> Vec<Rule> {
    rules
        .iter()
        .filter(|(_, resources, _)| !resources.contains(&resource))
        .copied()
        .collect()
}

/// Grants `cluster_role` to `user` in `namespace` only.
pub fn role_binding(namespace: &str, name: &str, cluster_role: &str, user: &str) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": { "name": name, "namespace": namespace },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role },
        "subjects": [ { "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user } ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parent_pod_is_bound_annotated_and_mounts_its_objects() {
        let owner = Owner {
            api_version: "apps/v1".into(),
            kind: "DaemonSet".into(),
            name: "ds".into(),
            uid: "u1".into(),
        };
        let pod = PodBuilder::new("ns", "kube-apiserver", "node-1")
            .checkpointed()
            .restart_never()
            .mount_secret("certs")
            .mount_config_map("config")
            .owned_by(&owner)
            .build();
        assert_eq!(pod["spec"]["nodeName"], "node-1");
        assert_eq!(pod["spec"]["restartPolicy"], "Never");
        assert_eq!(pod["metadata"]["annotations"][CHECKPOINT_ANNOTATION], "true");
        assert_eq!(pod["spec"]["volumes"][0]["secret"]["secretName"], "certs");
        assert_eq!(pod["spec"]["volumes"][1]["configMap"]["name"], "config");
        assert_eq!(pod["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(
            Owner::of(&json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "ds", "uid": "u1"}}))
            .unwrap()
            .uid,
            "u1"
        );
    }

    #[test]
    fn a_plain_pod_has_no_annotation_and_restarts() {
        let pod = PodBuilder::new("ns", "p", "node-1").build();
        assert!(pod["metadata"]["annotations"].is_null());
        assert_eq!(pod["spec"]["restartPolicy"], "Always");
    }

    #[test]
    fn rules_can_drop_one_resource() {
        let without = rules_without(AGENT_RULES, "secrets");
        assert_eq!(without.len(), AGENT_RULES.len() - 1);
        assert!(without.iter().all(|(_, r, _)| !r.contains(&"secrets")));
        let role = cluster_role("r", &without);
        assert_eq!(role["rules"].as_array().unwrap().len(), without.len());
    }
}
