//! The Kubernetes objects the scenarios and the demo create, as JSON for kubectl: pods bound
//! to the hollow node (no scheduler runs), their Secrets and ConfigMaps, DaemonSet objects to
//! own them (no controller-manager runs either, so the pods are created by hand with
//! ownerReferences), and the agent's RBAC, taken from the deploy manifests.

use anyhow::Context;
use serde_json::{Value, json};

/// The opt-in annotation of a parent pod.
pub const CHECKPOINT_ANNOTATION: &str = "checkpointer.alpha.coreos.com/checkpoint";

/// The user the agent's kubeconfig (`kubeconfig-agent`) authenticates as.
pub use crate::e2e_env::AGENT_USER;

/// An image that is never pulled: the hollow kubelet's runtime is fake.
const IMAGE: &str = "registry.invalid/pod-checkpointer-e2e:1";

pub fn namespace(name: &str) -> Value {
    json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": name } })
}

/// A Secret with `data` as `stringData`.
pub fn secret(namespace: &str, name: &str, data: &[(&str, &str)]) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": name, "namespace": namespace },
        "stringData": string_map(data),
    })
}

pub fn config_map(namespace: &str, name: &str, data: &[(&str, &str)]) -> Value {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": name, "namespace": namespace },
        "data": string_map(data),
    })
}

/// `{"key": "value", …}`.
fn string_map(pairs: &[(&str, &str)]) -> Value {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect()
}

pub fn service_account(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": { "name": name, "namespace": namespace },
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
    service_account: Option<String>,
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
            service_account: None,
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

    /// Runs as ServiceAccount `name` (the suite's API server does not default it).
    pub fn service_account(mut self, name: &str) -> PodBuilder {
        self.service_account = Some(name.to_owned());
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
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": metadata,
            "spec": {
                "nodeName": self.node,
                "restartPolicy": if self.restart_never { "Never" } else { "Always" },
                "containers": [ { "name": "main", "image": IMAGE, "volumeMounts": mounts } ],
                "volumes": volumes,
            },
        });
        if let Some(account) = &self.service_account {
            pod["spec"]["serviceAccountName"] = json!(account);
        }
        pod
    }
}

/// The deploy manifests (`deploy/pod-checkpointer.yaml`, rendered by `cargo xtask render`).
pub const DEPLOY_MANIFESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/pod-checkpointer.yaml");

/// The rules of the namespaced Roles `pod-checkpointer` and `pod-checkpointer-token` in the deploy manifests: what the
/// agent is granted in production. The suite and the demo grant exactly these (bound to the
/// agent's user instead of its ServiceAccount), so they prove the rules are enough.
pub fn deployed_agent_rules() -> anyhow::Result<Vec<Value>> {
    let text = std::fs::read_to_string(DEPLOY_MANIFESTS)
        .with_context(|| format!("cannot read the deploy manifests {DEPLOY_MANIFESTS}"))?;
    let mut rules =
        role_rules(&text, "pod-checkpointer").with_context(|| format!("in {DEPLOY_MANIFESTS}"))?;
    // Minting tokens for the static copy's account: its own Role in the install namespace,
    // which every scenario namespace stands for.
    rules.extend(
        role_rules(&text, "pod-checkpointer-token").with_context(|| format!("in {DEPLOY_MANIFESTS}"))?,
    );
    Ok(rules)
}

/// The rules of the ClusterRole `pod-checkpointer` in the deploy manifests (the kubelet
/// API, its own node): granted to the agent's user cluster-wide by the testbed.
pub fn deployed_agent_cluster_rules() -> anyhow::Result<Vec<Value>> {
    let text = std::fs::read_to_string(DEPLOY_MANIFESTS)
        .with_context(|| format!("cannot read the deploy manifests {DEPLOY_MANIFESTS}"))?;
    rules_of(&text, "ClusterRole", "pod-checkpointer").with_context(|| format!("in {DEPLOY_MANIFESTS}"))
}

/// The rules of the Role `name` in a multi-document YAML stream.
fn role_rules(yaml: &str, name: &str) -> anyhow::Result<Vec<Value>> {
    rules_of(yaml, "Role", name)
}

/// The rules of the `kind` (Role or ClusterRole) `name` in a multi-document YAML stream.
fn rules_of(yaml: &str, kind: &str, name: &str) -> anyhow::Result<Vec<Value>> {
    let documents: Vec<Value> = serde_saphyr::from_multiple(yaml).context("not valid YAML")?;
    let role = documents
        .iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .with_context(|| format!("no {kind} named {name}"))?;
    role["rules"]
        .as_array()
        .cloned()
        .with_context(|| format!("the Role {name} has no rules"))
}

/// A ClusterRole with `rules`, for RoleBindings in each namespace the agent may checkpoint.
pub fn cluster_role(name: &str, rules: &[Value]) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": { "name": name },
        "rules": rules,
    })
}

/// `rules` without any permission on `resource` (rules left with no resource are dropped).
pub fn rules_without(rules: &[Value], resource: &str) -> Vec<Value> {
    rules
        .iter()
        .filter_map(|rule| {
            let resources: Vec<Value> = rule["resources"]
                .as_array()?
                .iter()
                .filter(|r| *r != resource)
                .cloned()
                .collect();
            let mut rule = rule.clone();
            (!resources.is_empty()).then(|| {
                rule["resources"] = Value::Array(resources);
                rule
            })
        })
        .collect()
}

/// The ServiceAccount the checkpointer's pods run as, in each namespace that has them.
pub const CHECKPOINTER_SERVICE_ACCOUNT: &str = "pod-checkpointer";
/// The ServiceAccount the static copy authenticates as, with the tokens the DaemonSet copy
/// mints and keeps for it (the agent's `--static-service-account` default).
pub const STATIC_SERVICE_ACCOUNT: &str = "pod-checkpointer-static";

/// Minting tokens for [`STATIC_SERVICE_ACCOUNT`], and nothing else.
pub fn token_rules() -> Vec<Value> {
    vec![json!({
        "apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"],
        "resourceNames": [STATIC_SERVICE_ACCOUNT],
    })]
}

/// Grants `cluster_role` (the token rules) in `namespace` to `user` and the DaemonSet's
/// ServiceAccount, not to the static copy's: it cannot renew its own access.
pub fn token_role_binding(namespace: &str, cluster_role: &str, user: &str) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": { "name": cluster_role, "namespace": namespace },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role },
        "subjects": [
            { "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user },
            { "kind": "ServiceAccount", "name": CHECKPOINTER_SERVICE_ACCOUNT, "namespace": namespace },
        ],
    })
}

/// Grants `cluster_role` cluster-wide to `user`.
pub fn cluster_role_binding(name: &str, cluster_role: &str, user: &str) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": { "name": name },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role },
        "subjects": [ { "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user } ],
    })
}

/// Grants `cluster_role` in `namespace` only to `user` and, as the deployed RoleBinding
/// does, to the namespace's ServiceAccounts [`CHECKPOINTER_SERVICE_ACCOUNT`] and
/// [`STATIC_SERVICE_ACCOUNT`] (the static copy authenticates as the latter with the token
/// the DaemonSet copy keeps).
pub fn role_binding(namespace: &str, name: &str, cluster_role: &str, user: &str) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": { "name": name, "namespace": namespace },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role },
        "subjects": [
            { "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user },
            { "kind": "ServiceAccount", "name": CHECKPOINTER_SERVICE_ACCOUNT, "namespace": namespace },
            { "kind": "ServiceAccount", "name": STATIC_SERVICE_ACCOUNT, "namespace": namespace },
        ],
    })
}

/// The Prometheus operator's two CRDs that `render --prometheus` needs (PodMonitor and
/// PrometheusRule, `monitoring.coreos.com/v1`), without their schemas: enough for the API
/// server to store the objects, as a cluster with the operator would.
pub fn prometheus_operator_crds() -> Vec<Value> {
    [
        ("PodMonitor", "podmonitors"),
        ("PrometheusRule", "prometheusrules"),
    ]
    .into_iter()
    .map(|(kind, plural)| {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.monitoring.coreos.com")},
            "spec": {
                "group": "monitoring.coreos.com",
                "scope": "Namespaced",
                "names": {
                    "kind": kind,
                    "listKind": format!("{kind}List"),
                    "plural": plural,
                    "singular": kind.to_lowercase(),
                },
                "versions": [{
                    "name": "v1",
                    "served": true,
                    "storage": true,
                    "schema": {"openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": true,
                    }},
                }],
            },
        })
    })
    .collect()
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
    fn the_role_rules_come_from_the_manifests_and_can_lose_one_resource() {
        let yaml = "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: pod-checkpointer}\n---\n\
                    apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: pod-checkpointer}\n\
                    rules:\n- apiGroups: ['']\n  resources: [pods]\n  verbs: [get, list, watch]\n\
                    - apiGroups: ['']\n  resources: [secrets, configmaps]\n  verbs: [get]\n";
        let rules = role_rules(yaml, "pod-checkpointer").unwrap();
        assert_eq!(rules.len(), 2);
        assert!(role_rules(yaml, "other").is_err());
        let without = rules_without(&rules, "secrets");
        assert_eq!(without[1]["resources"], json!(["configmaps"]));
        assert_eq!(rules_without(&rules, "pods").len(), 1);
        assert_eq!(cluster_role("r", &without)["rules"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn the_deploy_manifests_grant_the_agent_its_pods() {
        let rules = deployed_agent_rules().unwrap();
        assert!(
            rules.iter().any(|r| r["resources"]
                .as_array()
                .is_some_and(|rs| rs.contains(&json!("pods")))),
            "{rules:?}"
        );
    }
}
