//! The self-hosted control plane's objects, as an operator of a bootkube cluster had them:
//! kube-apiserver as a host-network DaemonSet, kube-controller-manager and kube-scheduler as
//! Deployments, every pod annotated for checkpointing and reading its credentials and
//! settings from Secrets and a ConfigMap (never from a service-account token, which a
//! checkpoint cannot carry).

use std::net::Ipv4Addr;
use std::path::Path;

use serde_json::{Value, json};

use crate::e2e_env::{Release, render_kubeconfig};
use crate::image::{CONTROL_PLANE_BIN_DIR, CONTROL_PLANE_IMAGE};

/// Where everything lives: the agent's default `--namespaces` and where `deploy` puts it.
pub const NAMESPACE: &str = "kube-system";
/// The label every object here carries, so a clean-up finds them all.
pub const LABEL: &str = "pod-checkpointer.e2e/self-hosted";
pub const APISERVER: &str = "kube-apiserver";
pub const CONTROLLER_MANAGER: &str = "kube-controller-manager";
pub const SCHEDULER: &str = "kube-scheduler";
/// The self-hosted API server's port on every address of the node.
pub const APISERVER_PORT: u16 = 6443;
/// The health ports of the self-hosted controller-manager and scheduler, on the node's
/// loopback (their defaults in 1.20).
pub const CONTROLLER_MANAGER_PORT: u16 = 10257;
pub const SCHEDULER_PORT: u16 = 10259;
/// How long a deleted API server pod gets to exit. A SIGTERMed kube-apiserver keeps serving
/// while it drains; what is left of this counts as two API servers at once in a handoff.
pub const APISERVER_GRACE_SECONDS: u32 = 15;
/// Where the API server's Secret is mounted.
const SECRETS_DIR: &str = "/etc/kubernetes/secrets";
/// Where the controller-manager's and the scheduler's Secret (a kubeconfig and its CA) is
/// mounted.
const KUBECONFIG_DIR: &str = "/etc/kubernetes/kubeconfig";
/// The annotation that opts a pod into checkpointing.
const CHECKPOINT_ANNOTATION: &str = "checkpointer.alpha.coreos.com/checkpoint";
/// kube-apiserver binds beside its checkpoint (`--permit-port-sharing`): the checkpoint
/// stays until the parent is Ready, so a handoff has no API gap.
const HANDOFF_ANNOTATION: &str = "checkpointer.alpha.coreos.com/handoff";

/// What the objects carry: the plane's PKI and tokens, and where etcd and the node are.
#[derive(Clone, Debug)]
pub struct Params {
    /// PEM of the CA that signed `apiserver_crt`.
    pub ca_crt: String,
    /// The serving certificate (it names the node's address and 127.0.0.1) and its key.
    pub apiserver_crt: String,
    pub apiserver_key: String,
    /// The service-account key: it verifies tokens the bootstrap API server signed, and
    /// signs new ones with the same issuer.
    pub sa_key: String,
    /// The static token file: the same identities as the bootstrap API server's.
    pub tokens_csv: String,
    pub controller_manager_token: String,
    pub scheduler_token: String,
    /// etcd's client URL as the node reaches it (on several nodes: each node's own member,
    /// on its loopback).
    pub etcd_servers: String,
    /// The node's address, which the API server advertises; `None` on several nodes: each
    /// pod advertises its node's (`status.hostIP`).
    pub node_ip: Option<Ipv4Addr>,
    /// How many pods the controller-manager's and the scheduler's Deployments run.
    pub replicas: u32,
    /// The release the image's programs are: which flags they take.
    pub release: Release,
}

/// Every object of the self-hosted control plane, in the order to apply them.
pub fn control_plane_objects(params: &Params) -> Vec<Value> {
    let kubeconfig = |user: &str, token: &str| {
        render_kubeconfig(
            &format!("https://127.0.0.1:{APISERVER_PORT}"),
            &Path::new(KUBECONFIG_DIR).join("ca.crt"),
            user,
            token,
        )
    };
    vec![
        secret(
            APISERVER,
            json!({
                "ca.crt": params.ca_crt,
                "apiserver.crt": params.apiserver_crt,
                "apiserver.key": params.apiserver_key,
                "sa.key": params.sa_key,
                "tokens.csv": params.tokens_csv,
            }),
        ),
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata(&format!("{APISERVER}-config")),
            "data": {
                "etcd-servers": params.etcd_servers,
                "advertise-address": params.node_ip.map(|ip| ip.to_string()).unwrap_or_default(),
                // Must be the bootstrap API server's: both allocate from it in etcd.
                "service-cluster-ip-range": "10.96.0.0/16",
            }
        }),
        secret(
            CONTROLLER_MANAGER,
            json!({
                "kubeconfig": kubeconfig(CONTROLLER_MANAGER, &params.controller_manager_token),
                "ca.crt": params.ca_crt,
            }),
        ),
        secret(
            SCHEDULER,
            json!({
                "kubeconfig": kubeconfig(SCHEDULER, &params.scheduler_token),
                "ca.crt": params.ca_crt,
            }),
        ),
        apiserver_daemonset(params.release, params.node_ip.is_none()),
        deployment(
            CONTROLLER_MANAGER,
            params.replicas,
            controller_manager_container(params.release),
        ),
        deployment(SCHEDULER, params.replicas, scheduler_container(params.release)),
    ]
}

fn metadata(name: &str) -> Value {
    json!({ "name": name, "namespace": NAMESPACE, "labels": { LABEL: "true" } })
}

fn secret(name: &str, data: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(name),
        "stringData": data,
    })
}

/// What every control-plane pod shares: checkpointed, on the host's network, critical,
/// tolerating every taint, no service-account token.
///
/// No nodeSelector: after a power cut the kubelet may admit pods before its Node lister has
/// synced, against a Node without the cluster's labels, and fail every pod that selects
/// one (NodeAffinity). Nothing deletes a Deployment pod failed that way (its ReplicaSet
/// makes another beside it), so its checkpoint would stay active for good. On this one-node
/// cluster a selector would choose nothing anyway.
fn pod_template(app: &str, grace_seconds: u32, container: Value, volumes: Value) -> Value {
    json!({
        "metadata": {
            "labels": { "k8s-app": app, LABEL: "true" },
            "annotations": { CHECKPOINT_ANNOTATION: "true" }
        },
        "spec": {
            "hostNetwork": true,
            "priorityClassName": "system-node-critical",
            "tolerations": [{ "operator": "Exists" }],
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": grace_seconds,
            "containers": [container],
            "volumes": volumes,
        }
    })
}

fn secret_volume(name: &str, secret: &str) -> Value {
    json!({ "name": name, "secret": { "secretName": secret, "defaultMode": 0o400 } })
}

fn program(name: &str) -> String {
    format!("{CONTROL_PLANE_BIN_DIR}/{name}")
}

/// Flags that only 1.20 has: they were removed since (the insecure ports in 1.24, the bound
/// token gate once GA); `flags` with them left out on a later release.
fn for_release(release: Release, flags: Vec<String>) -> Vec<String> {
    const V1_20_ONLY: [&str; 3] = [
        "--insecure-port=",
        "--port=",
        "--feature-gates=BoundServiceAccountTokenVolume=",
    ];
    flags
        .into_iter()
        .filter(|flag| release == Release::V1_20 || !V1_20_ONLY.iter().any(|f| flag.starts_with(f)))
        .collect()
}

/// How long a kube-apiserver pod must be Ready before its DaemonSet counts it available: the
/// agent's own wait for an unproven parent (docs/behaviour.md, "A handoff without a gap").
pub const APISERVER_MIN_READY_SECONDS: u32 = 10;

/// kube-apiserver on every address of the node. 1.20 has no config file, so the settings
/// that differ per cluster come from the ConfigMap through the environment; with
/// `advertise_host_ip` (several nodes) the address it advertises is its node's, from the
/// downward API, which a checkpoint keeps as it is and its kubelet resolves.
fn apiserver_daemonset(release: Release, advertise_host_ip: bool) -> Value {
    let secrets = |file: &str| format!("{SECRETS_DIR}/{file}");
    let config_env = |var: &str, key: &str| {
        json!({
            "name": var,
            "valueFrom": { "configMapKeyRef": { "name": format!("{APISERVER}-config"), "key": key } }
        })
    };
    let container = json!({
        "name": APISERVER,
        "image": CONTROL_PLANE_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": for_release(release, vec![
            program(APISERVER),
            "--etcd-servers=$(ETCD_SERVERS)".into(),
            "--advertise-address=$(ADVERTISE_ADDRESS)".into(),
            "--service-cluster-ip-range=$(SERVICE_CLUSTER_IP_RANGE)".into(),
            "--bind-address=0.0.0.0".into(),
            format!("--secure-port={APISERVER_PORT}"),
            // SO_REUSEPORT: the parent binds beside its running checkpoint instead of
            // crash-looping on EADDRINUSE until the checkpoint is retired (the "port battle").
            "--permit-port-sharing=true".into(),
            // 1.20 still opens 127.0.0.1:8080 by default, where a second copy would clash.
            "--insecure-port=0".into(),
            format!("--tls-cert-file={}", secrets("apiserver.crt")),
            format!("--tls-private-key-file={}", secrets("apiserver.key")),
            format!("--token-auth-file={}", secrets("tokens.csv")),
            "--authorization-mode=Node,RBAC".into(),
            "--enable-admission-plugins=NodeRestriction".into(),
            format!("--service-account-key-file={}", secrets("sa.key")),
            format!("--service-account-signing-key-file={}", secrets("sa.key")),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            "--feature-gates=BoundServiceAccountTokenVolume=true".into(),
            "--kubelet-preferred-address-types=InternalIP,Hostname".into(),
            "--endpoint-reconciler-type=none".into(),
            "--allow-privileged=true".into(),
        ]),
        "env": [
            config_env("ETCD_SERVERS", "etcd-servers"),
            if advertise_host_ip {
                json!({ "name": "ADVERTISE_ADDRESS", "valueFrom": { "fieldRef": { "fieldPath": "status.hostIP" } } })
            } else {
                config_env("ADVERTISE_ADDRESS", "advertise-address")
            },
            config_env("SERVICE_CLUSTER_IP_RANGE", "service-cluster-ip-range"),
        ],
        "readinessProbe": {
            "httpGet": { "scheme": "HTTPS", "path": "/readyz", "port": APISERVER_PORT },
            "periodSeconds": 2,
            "failureThreshold": 2,
        },
        "volumeMounts": [{ "name": "secrets", "mountPath": SECRETS_DIR, "readOnly": true }],
    });
    let mut template = pod_template(
        APISERVER,
        APISERVER_GRACE_SECONDS,
        container,
        json!([secret_volume("secrets", APISERVER)]),
    );
    template["metadata"]["annotations"][HANDOFF_ANNOTATION] = json!("when-ready");
    json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": metadata(APISERVER),
        "spec": {
            "selector": { "matchLabels": { "k8s-app": APISERVER } },
            // Each start of a crash-looping pod reads Ready for a probe period, its probe
            // answered by the checkpoint on the port they share: without a minimum, the
            // controller counts that pod available and takes the next node.
            "minReadySeconds": APISERVER_MIN_READY_SECONDS,
            "updateStrategy": { "type": "RollingUpdate", "rollingUpdate": { "maxUnavailable": 1 } },
            "template": template,
        }
    })
}

fn kubeconfig_mount() -> Value {
    json!([{ "name": "kubeconfig", "mountPath": KUBECONFIG_DIR, "readOnly": true }])
}

/// kube-controller-manager as the host one runs (every controller but legacy token
/// Secrets), on a Lease, with the CA from its Secret as the root CA it publishes.
fn controller_manager_container(release: Release) -> Value {
    json!({
        "name": CONTROLLER_MANAGER,
        "image": CONTROL_PLANE_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": for_release(release, vec![
            program(CONTROLLER_MANAGER),
            format!("--kubeconfig={KUBECONFIG_DIR}/kubeconfig"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={CONTROLLER_MANAGER_PORT}"),
            "--permit-port-sharing=true".into(),
            "--port=0".into(),
            "--leader-elect=true".into(),
            "--leader-elect-resource-lock=leases".into(),
            "--use-service-account-credentials=false".into(),
            format!("--controllers=*,-{}", release.token_controller()),
            format!("--root-ca-file={KUBECONFIG_DIR}/ca.crt"),
            "--feature-gates=BoundServiceAccountTokenVolume=true".into(),
            "--flex-volume-plugin-dir=/tmp/flex-volumes".into(),
        ]),
        "volumeMounts": kubeconfig_mount(),
    })
}

fn scheduler_container(release: Release) -> Value {
    json!({
        "name": SCHEDULER,
        "image": CONTROL_PLANE_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": for_release(release, vec![
            program(SCHEDULER),
            format!("--kubeconfig={KUBECONFIG_DIR}/kubeconfig"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={SCHEDULER_PORT}"),
            "--permit-port-sharing=true".into(),
            "--port=0".into(),
            "--leader-elect=true".into(),
            "--leader-elect-resource-lock=leases".into(),
        ]),
        "volumeMounts": kubeconfig_mount(),
    })
}

fn deployment(name: &str, replicas: u32, container: Value) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(name),
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "k8s-app": name } },
            "template": pod_template(name, 5, container, json!([secret_volume("kubeconfig", name)])),
        }
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use ckpt_core::{ApiObjects, SanitizeOptions, Timestamp, sanitize};
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};

    use super::*;

    fn params() -> Params {
        Params {
            ca_crt: "CA".into(),
            apiserver_crt: "CRT".into(),
            apiserver_key: "KEY".into(),
            sa_key: "SA".into(),
            tokens_csv: "t,admin,uid-admin\n".into(),
            controller_manager_token: "kcm-token".into(),
            scheduler_token: "sched-token".into(),
            etcd_servers: "http://10.213.0.1:12379".into(),
            node_ip: Some(Ipv4Addr::new(10, 213, 0, 2)),
            replicas: 1,
            release: Release::V1_20,
        }
    }

    /// The API objects as the API server would store them: `stringData` as `data`.
    fn api_objects(objects: &[Value]) -> ApiObjects {
        let mut api = ApiObjects::default();
        for object in objects {
            let name = object["metadata"]["name"].as_str().unwrap().to_owned();
            match object["kind"].as_str() {
                Some("Secret") => {
                    let data = object["stringData"]
                        .as_object()
                        .unwrap()
                        .iter()
                        .map(|(k, v)| (k.clone(), ByteString(v.as_str().unwrap().as_bytes().to_vec())))
                        .collect();
                    let secret = Secret {
                        metadata: serde_json::from_value(object["metadata"].clone()).unwrap(),
                        data: Some(data),
                        ..Secret::default()
                    };
                    api.secrets.insert(name, secret.into());
                }
                Some("ConfigMap") => {
                    let config: ConfigMap = serde_json::from_value(object.clone()).unwrap();
                    api.config_maps.insert(name, config.into());
                }
                _ => {}
            }
        }
        api
    }

    /// The pod a workload's controller would create from its template.
    fn pod_of(workload: &Value) -> Pod {
        let name = workload["metadata"]["name"].as_str().unwrap();
        let mut pod = workload["spec"]["template"].clone();
        pod["apiVersion"] = json!("v1");
        pod["kind"] = json!("Pod");
        pod["metadata"]["name"] = json!(format!("{name}-abcde"));
        pod["metadata"]["namespace"] = json!(NAMESPACE);
        pod["metadata"]["uid"] = json!(format!("uid-{name}"));
        pod["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "apps/v1", "kind": workload["kind"], "name": name,
            "uid": "uid-owner", "controller": true
        }]);
        serde_json::from_value(pod).unwrap()
    }

    #[test]
    fn every_control_plane_pod_becomes_a_checkpoint_with_its_files_and_settings() {
        let objects = control_plane_objects(&params());
        let api = api_objects(&objects);
        let options = SanitizeOptions {
            checkpoint_dir: "/etc/kubernetes/checkpoint".into(),
            checkpointed_at: Timestamp::parse_rfc3339("2026-12-05T00:00:00Z").unwrap(),
        };
        let workloads: Vec<&Value> = objects
            .iter()
            .filter(|o| matches!(o["kind"].as_str(), Some("DaemonSet" | "Deployment")))
            .collect();
        assert_eq!(workloads.len(), 3);
        for workload in workloads {
            let name = workload["metadata"]["name"].as_str().unwrap();
            let sanitized = sanitize(&pod_of(workload), &api, &options)
                .unwrap_or_else(|e| panic!("{name} cannot be checkpointed: {e}"));
            let manifest: Value = serde_json::to_value(&sanitized.checkpoint.manifest).unwrap();
            let volumes = manifest["spec"]["volumes"].as_array().unwrap();
            assert!(
                volumes.iter().all(|v| v["hostPath"]["type"] == "Directory"),
                "{name}: {volumes:?}"
            );
            // Every file of its Secret is carried, with its content.
            let files: BTreeMap<String, Vec<u8>> = sanitized
                .checkpoint
                .dirs
                .iter()
                .flat_map(|dir| dir.files.iter().map(|f| (f.path.clone(), f.bytes.clone())))
                .collect();
            let expected = if name == APISERVER { 5 } else { 2 };
            assert_eq!(files.len(), expected, "{name}: {:?}", files.keys());
            let container = &manifest["spec"]["containers"][0];
            if name == APISERVER {
                assert_eq!(files.get("sa.key").map(Vec::as_slice), Some(&b"SA"[..]));
                // The ConfigMap's settings are literals now: no API object is referenced.
                let env = container["env"].as_array().unwrap();
                assert!(env.iter().all(|e| e.get("valueFrom").is_none()), "{env:?}");
                assert!(env.contains(&json!({ "name": "ETCD_SERVERS", "value": "http://10.213.0.1:12379" })));
            } else {
                let kubeconfig = String::from_utf8(files["kubeconfig"].clone()).unwrap();
                assert!(kubeconfig.contains("https://127.0.0.1:6443"), "{kubeconfig}");
                assert!(
                    kubeconfig.contains("/etc/kubernetes/kubeconfig/ca.crt"),
                    "{kubeconfig}"
                );
            }
            assert_eq!(manifest["spec"]["hostNetwork"], true);
            let command = container["command"].as_array().unwrap();
            assert!(
                command.contains(&json!("--permit-port-sharing=true")),
                "{name}: {command:?}"
            );
            assert!(manifest["spec"].get("serviceAccountName").is_none());
            assert!(sanitized.warnings.is_empty(), "{name}: {:?}", sanitized.warnings);
        }
    }

    #[test]
    fn on_several_nodes_each_api_server_advertises_its_node_and_the_controllers_run_twice() {
        let objects = control_plane_objects(&Params {
            etcd_servers: "http://127.0.0.1:2379".into(),
            node_ip: None,
            replicas: 2,
            ..params()
        });
        let kind = |kind: &'static str| objects.iter().filter(move |o| o["kind"] == kind);
        let daemonset = kind("DaemonSet").next().unwrap();
        let env = &daemonset["spec"]["template"]["spec"]["containers"][0]["env"];
        assert!(
            env.as_array().unwrap().contains(&json!({
                "name": "ADVERTISE_ADDRESS",
                "valueFrom": { "fieldRef": { "fieldPath": "status.hostIP" } }
            })),
            "{env}"
        );
        assert!(kind("Deployment").all(|d| d["spec"]["replicas"] == 2));
        let config = kind("ConfigMap").next().unwrap();
        assert_eq!(config["data"]["etcd-servers"], "http://127.0.0.1:2379");
    }

    #[test]
    fn every_object_is_labelled_for_the_clean_up_and_lives_in_kube_system() {
        for object in control_plane_objects(&params()) {
            assert_eq!(object["metadata"]["namespace"], NAMESPACE);
            assert_eq!(object["metadata"]["labels"][LABEL], "true");
        }
    }
}
