//! The objects themselves: identities, RBAC (each rule with its reason), the agent's
//! config, the API kubeconfig, and the DaemonSet.

use std::collections::BTreeMap;

use ckpt_core::DataKind;
use ckpt_store::Layout;
use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, RollingUpdateDaemonSet};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource,
    EnvVar, EnvVarSource, ExecAction, HostPathVolumeSource, LocalObjectReference, Namespace, NodeAffinity,
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectFieldSelector, PodSecurityContext,
    PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile, SecurityContext, ServiceAccount,
    Toleration, Volume, VolumeMount,
};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use sha2::{Digest, Sha256};

use crate::defaults::{CONFIG_API_VERSION, CONFIG_KIND, DEFAULT_NAMESPACE, MEMORY_REQUEST};
use crate::manifest::Manifest;
use crate::monitoring;
use crate::options::{ApiEndpoint, KubeletTrust, ManifestOptions, parent_dir};
use crate::{NAME, STATIC_NAME, labels};

/// Marks a pod for checkpointing; on the agent's own template it checkpoints itself.
pub(crate) const CHECKPOINT_ANNOTATION: &str = "checkpointer.alpha.coreos.com/checkpoint";
/// A hash of the agent's config and kubeconfig on the pod template, so a change rolls the
/// pods (the agent reads both only at start).
pub(crate) const CONFIG_HASH_ANNOTATION: &str = "checkpointer.alpha.coreos.com/config-hash";
/// Where the config ConfigMap is mounted, and its key.
pub(crate) const CONFIG_DIR: &str = "/etc/pod-checkpointer";
pub(crate) const CONFIG_KEY: &str = "config.yaml";
/// The kubeconfig ConfigMap (bootkube's `kubeconfig-in-cluster`), where it is mounted, and
/// its key.
pub(crate) const KUBECONFIG_NAME: &str = "pod-checkpointer-kubeconfig";
pub(crate) const KUBECONFIG_DIR: &str = "/etc/pod-checkpointer-kubeconfig";
pub(crate) const KUBECONFIG_KEY: &str = "kubeconfig";
/// The token Role and its binding: minting tokens for the static copy's account only.
pub(crate) const TOKEN_ROLE_NAME: &str = "pod-checkpointer-token";
/// The kubelet API ClusterRole, only when the agent reads the kubelet.
pub(crate) const KUBELET_ROLE_NAME: &str = "pod-checkpointer-kubelet";
/// What the kubelet mounts into every pod that runs as a service account.
pub(crate) const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The pod's own emptyDir with the health socket: each pod (the DaemonSet pod and the
/// static copy) gets its own directory from the kubelet, so the probe of one pod can only
/// reach the agent of that pod, although both share the host network.
pub(crate) const HEALTH_DIR: &str = "/run/pod-checkpointer-health";
const HEALTH_SOCKET_NAME: &str = "health.sock";
/// Where the agent binary is in the image (the Containerfile's ENTRYPOINT).
const AGENT_BINARY: &str = "/pod-checkpointer";

pub(crate) const CHECKPOINT_DIR: &str = Layout::DEFAULT_CHECKPOINT_DIR;

/// The directories under the checkpoint dir the agent writes, each mounted alone: the
/// checkpoint dir itself (`/etc/kubernetes`) holds the cluster's credentials and `pki/`.
/// The store's layout decides this list: inactive checkpoints, the data roots, the
/// quarantine, and the agent's own dir (the state journal and the kept credentials).
const CHECKPOINT_SUBDIRS: [&str; 6] = [
    Layout::INACTIVE_DIR_NAME,
    DataKind::Secret.root_dir_name(),
    DataKind::ConfigMap.root_dir_name(),
    DataKind::Projected.root_dir_name(),
    Layout::QUARANTINE_DIR_NAME,
    Layout::AGENT_DIR_NAME,
];

/// The capabilities the agent keeps (all others are dropped): it runs as root and writes
/// only root-owned host directories, but gives checkpointed data to the pods' users.
/// `CHOWN`: data files and directories go to the pod's runAsUser/fsGroup.
/// `FOWNER`: their modes are set after they changed owner (chmod of a file root no longer
/// owns), and timestamps are kept on them.
/// `DAC_OVERRIDE`: replacing and removing data inside a directory now owned by a pod's user
/// (mode 0700) is refused to a root without it.
pub(crate) const CAPABILITIES: [&str; 3] = ["CHOWN", "DAC_OVERRIDE", "FOWNER"];

pub(crate) fn health_socket() -> String {
    format!("{HEALTH_DIR}/{HEALTH_SOCKET_NAME}")
}

/// Pod Security admission's modes, each labelled `privileged` on a namespace render creates.
pub(crate) const POD_SECURITY_MODES: [&str; 3] = ["enforce", "audit", "warn"];

/// Every object of the install, in the order they must be applied (namespace and identity
/// first, the DaemonSet whose pods use them last).
pub fn render(options: &ManifestOptions) -> Vec<Manifest> {
    let mut objects = Vec::new();
    if options.namespace != DEFAULT_NAMESPACE {
        // Pod Security admission (1.25+) must let the agent's pods in: host network,
        // hostPath volumes, root. `privileged` says so instead of inheriting a cluster
        // default of `baseline` or `restricted`, which would refuse every pod.
        let mut metadata = cluster_meta(&options.namespace);
        metadata.labels = Some(
            POD_SECURITY_MODES
                .iter()
                .map(|mode| {
                    (
                        format!("pod-security.kubernetes.io/{mode}"),
                        "privileged".to_owned(),
                    )
                })
                .collect(),
        );
        objects.push(Manifest::Namespace(Namespace {
            metadata,
            ..Namespace::default()
        }));
    }
    for account in [NAME, STATIC_NAME] {
        objects.push(Manifest::ServiceAccount(ServiceAccount {
            metadata: namespaced_meta(account, &options.namespace),
            ..ServiceAccount::default()
        }));
    }
    objects.push(Manifest::ConfigMap(ConfigMap {
        metadata: namespaced_meta(NAME, &options.namespace),
        data: Some(BTreeMap::from([(CONFIG_KEY.to_owned(), options.agent_config())])),
        ..ConfigMap::default()
    }));
    if let Some(kubeconfig) = api_kubeconfig(&options.api) {
        objects.push(Manifest::ConfigMap(ConfigMap {
            metadata: namespaced_meta(KUBECONFIG_NAME, &options.namespace),
            data: Some(BTreeMap::from([(KUBECONFIG_KEY.to_owned(), kubeconfig)])),
            ..ConfigMap::default()
        }));
    }
    // Read-only, both copies: the agent's account and the static copy's.
    objects.push(Manifest::ClusterRole(ClusterRole {
        metadata: cluster_meta(NAME),
        rules: Some(vec![node_rule()]),
        ..ClusterRole::default()
    }));
    objects.push(Manifest::ClusterRoleBinding(ClusterRoleBinding {
        metadata: cluster_meta(NAME),
        role_ref: role_ref("ClusterRole", NAME),
        subjects: Some(subjects(options, true)),
    }));
    if options.kubelet != KubeletTrust::NotUsed {
        objects.push(Manifest::ClusterRole(ClusterRole {
            metadata: cluster_meta(KUBELET_ROLE_NAME),
            rules: Some(vec![kubelet_api_rule(options)]),
            ..ClusterRole::default()
        }));
        objects.push(Manifest::ClusterRoleBinding(ClusterRoleBinding {
            metadata: cluster_meta(KUBELET_ROLE_NAME),
            role_ref: role_ref("ClusterRole", KUBELET_ROLE_NAME),
            subjects: Some(subjects(options, true)),
        }));
    }
    for ns in &options.namespaces {
        objects.push(Manifest::Role(Role {
            metadata: namespaced_meta(NAME, ns),
            rules: Some(namespace_rules()),
        }));
        objects.push(Manifest::RoleBinding(RoleBinding {
            metadata: namespaced_meta(NAME, ns),
            role_ref: role_ref("Role", NAME),
            subjects: Some(subjects(options, true)),
        }));
    }
    // Minting tokens: the agent's account only, and only for the static copy's account.
    objects.push(Manifest::Role(Role {
        metadata: namespaced_meta(TOKEN_ROLE_NAME, &options.namespace),
        rules: Some(vec![token_rule()]),
    }));
    objects.push(Manifest::RoleBinding(RoleBinding {
        metadata: namespaced_meta(TOKEN_ROLE_NAME, &options.namespace),
        role_ref: role_ref("Role", TOKEN_ROLE_NAME),
        subjects: Some(subjects(options, false)),
    }));
    objects.push(Manifest::DaemonSet(Box::new(daemonset(options))));
    if options.prometheus_port.is_some() {
        objects.extend(monitoring::objects(options));
    }
    objects
}

/// The reason for a rule, written above it in the YAML; `None` for a rule nobody
/// explained (rendering refuses it).
pub(crate) fn why(rule: &PolicyRule) -> Option<&'static str> {
    let resources = rule.resources.as_deref().unwrap_or_default();
    let first = resources.first().map(String::as_str)?;
    Some(match first {
        "nodes" => {
            "its own node: its kubelet's version, and whether a DaemonSet whose pod is gone still targets it (a rollout keeps its checkpoints; the agent's own descheduled means self-GC); a ClusterRole cannot name the node"
        }
        "nodes/pods" | "nodes/proxy" => {
            "GET /pods on the kubelet (--runtime-endpoint \"\"): which pods run; the kubelet authorizes it as nodes/pods from 1.33 on, as nodes/proxy before"
        }
        "pods" => "a watch of the pods on its node (field selector spec.nodeName): the parents to checkpoint",
        "secrets" => {
            "the Secrets and ConfigMaps checkpointed pods mount, each watched by name, so a change is written at once"
        }
        "events" => {
            "Events on the parent pods (activated, deactivated, removed, refused): created, then patched when repeated"
        }
        "daemonsets" => {
            "a parent's controller owner (owner-reference strategy: deleted or moved?), and the DaemonSet of a checkpoint whose pod is gone (its own included): does it still target the node?"
        }
        "jobs" => "a parent's controller owner when it is a Job (owner-reference strategy)",
        "replicationcontrollers" => {
            "a parent's controller owner when it is a ReplicationController (owner-reference strategy)"
        }
        "serviceaccounts/token" => {
            "the static copy's API credentials: tokens of the static copy's account only, kept on disk for it"
        }
        _ => return None,
    })
}

/// The volume of the lock file's directory.
const LOCK_DIR_VOLUME: &str = "lock-dir";

/// The host directory of the lock file, as the DaemonSet mounts it.
pub(crate) fn lock_dir_of(daemonset: &DaemonSet) -> String {
    (daemonset.spec.template.spec.as_ref())
        .and_then(|pod| pod.volumes.as_ref())
        .and_then(|volumes| volumes.iter().find(|v| v.name == LOCK_DIR_VOLUME))
        .and_then(|v| v.host_path.as_ref())
        .map_or_else(|| "/".to_owned(), |h| h.path.clone())
}

/// Whether the agent's container has a memory limit (`--memory-limit`).
pub(crate) fn memory_limited(daemonset: &DaemonSet) -> bool {
    (daemonset.spec.template.spec.as_ref())
        .and_then(|pod| pod.containers.first())
        .and_then(|c| c.resources.as_ref())
        .and_then(|r| r.limits.as_ref())
        .is_some_and(|limits| limits.contains_key("memory"))
}

/// Comments on the DaemonSet's security choices, inserted above the lines they explain.
pub(crate) fn explain_daemonset(yaml: &str, lock_dir: &str, memory_limited: bool) -> String {
    let lock_dir = format!("path: {lock_dir}");
    let resources = if memory_limited {
        "A memory limit (--memory-limit): an agent OOM-killed during an outage takes the \
         recovery down with it, and the static copy inherits the limit."
    } else {
        "Requests only, no memory limit: an agent OOM-killed during an outage would take the \
         recovery down with it, and the static copy would inherit the limit."
    };
    let notes: [(&str, &str); 5] = [
        ("resources:", resources),
        (
            "capabilities:",
            "Root, with every capability dropped but CHOWN and FOWNER (data goes to the pods' \
             users, modes set after) and DAC_OVERRIDE (data dirs then owned by those users).",
        ),
        (
            "tolerations:",
            "Every taint: the node agent must keep running where the control plane runs.",
        ),
        (
            "readinessProbe:",
            "Probes ask the agent of this pod over the socket in this pod's emptyDir: the other \
             copy shares the host network, never this directory.",
        ),
        (
            &lock_dir,
            "LOCK DIR: the directory of the lock file both copies share (--lock-file).",
        ),
    ];
    let mut out = String::with_capacity(yaml.len() + 1024);
    let mut done = [false; 5];
    for line in yaml.lines() {
        let trimmed = line.trim_start();
        for (index, (key, note)) in notes.iter().enumerate() {
            if !done[index] && trimmed == *key {
                done[index] = true;
                let indent = &line[..line.len() - trimmed.len()];
                out.push_str(&format!("{indent}# {note}\n"));
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The kubeconfig the agent runs with when --api-server names a server: the pod's own
/// service-account token and CA (files the kubelet keeps fresh), like bootkube's
/// `kubeconfig-in-cluster`.
fn api_kubeconfig(api: &ApiEndpoint) -> Option<String> {
    let ApiEndpoint::Server { url, tls_server_name } = api else {
        return None;
    };
    // Quoted like the agent config's strings: a name is free text.
    let server_name = tls_server_name
        .as_deref()
        .map(|name| format!("    tls-server-name: {}\n", quoted(name)))
        .unwrap_or_default();
    let url = quoted(url);
    Some(format!(
        "# The agent's API server (render's --api-server, the chart's apiServer), with the pod's\n\
         # service-account token and CA.\n\
         apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: api\n  cluster:\n    server: {url}\n{server_name}    certificate-authority: {SERVICE_ACCOUNT_DIR}/ca.crt\n\
         users:\n\
         - name: service-account\n  user:\n    tokenFile: {SERVICE_ACCOUNT_DIR}/token\n\
         contexts:\n\
         - name: pod-checkpointer\n  context:\n    cluster: api\n    user: service-account\n\
         current-context: pod-checkpointer\n"
    ))
}

fn cluster_meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        labels: Some(labels()),
        ..ObjectMeta::default()
    }
}

fn namespaced_meta(name: &str, namespace: &str) -> ObjectMeta {
    ObjectMeta {
        namespace: Some(namespace.to_owned()),
        ..cluster_meta(name)
    }
}

fn role_ref(kind: &str, name: &str) -> RoleRef {
    RoleRef {
        api_group: Some("rbac.authorization.k8s.io".into()),
        kind: kind.into(),
        name: name.into(),
    }
}

/// The agent's account, the static copy's when `with_static`, and any extra user.
fn subjects(options: &ManifestOptions, with_static: bool) -> Vec<Subject> {
    let account = |name: &str| Subject {
        kind: "ServiceAccount".into(),
        name: name.into(),
        namespace: Some(options.namespace.clone()),
        ..Subject::default()
    };
    let mut subjects = vec![account(NAME)];
    if with_static {
        subjects.push(account(STATIC_NAME));
    }
    subjects.extend(options.bind_users.iter().map(|user| Subject {
        api_group: Some("rbac.authorization.k8s.io".into()),
        kind: "User".into(),
        name: user.clone(),
        ..Subject::default()
    }));
    subjects
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    let strings = |items: &[&str]| Some(items.iter().map(|s| (*s).to_owned()).collect());
    PolicyRule {
        api_groups: strings(groups),
        resources: strings(resources),
        verbs: verbs.iter().map(|s| (*s).to_owned()).collect(),
        ..PolicyRule::default()
    }
}

fn node_rule() -> PolicyRule {
    rule(&[""], &["nodes"], &["get"])
}

/// `nodes/proxy` also allows exec into any pod on the node, so it is granted only where
/// the kubelet knows nothing narrower.
fn kubelet_api_rule(options: &ManifestOptions) -> PolicyRule {
    let subresource = if options.kubernetes_version.kubelet_authorizes_nodes_pods() {
        "nodes/pods"
    } else {
        "nodes/proxy"
    };
    rule(&[""], &[subresource], &["get"])
}

fn token_rule() -> PolicyRule {
    PolicyRule {
        resource_names: Some(vec![STATIC_NAME.to_owned()]),
        ..rule(&[""], &["serviceaccounts/token"], &["create"])
    }
}

/// What the agent does in each namespace it checkpoints. Only controllers that own pods
/// directly: Deployments and CronJobs own ReplicaSets and Jobs, never pods.
fn namespace_rules() -> Vec<PolicyRule> {
    vec![
        rule(&[""], &["pods"], &["get", "list", "watch"]),
        rule(&[""], &["secrets", "configmaps"], &["get", "list", "watch"]),
        // kube's recorder writes events.k8s.io/v1 Events only.
        rule(&["events.k8s.io"], &["events"], &["create", "patch"]),
        rule(
            &["apps"],
            &["daemonsets", "replicasets", "statefulsets"],
            &["get"],
        ),
        rule(&["batch"], &["jobs"], &["get"]),
        rule(&[""], &["replicationcontrollers"], &["get"]),
    ]
}

fn daemonset(options: &ManifestOptions) -> DaemonSet {
    let update = if options.rolls_with_surge() {
        // The new pod starts (and checkpoints itself) before the old one stops, so no node
        // is ever without a running agent. The new pod waits on the lock the old one (or
        // the static copy) holds, and is Ready meanwhile ("standby"), so the rollout moves on.
        RollingUpdateDaemonSet {
            max_surge: Some(IntOrString::Int(1)),
            max_unavailable: Some(IntOrString::Int(0)),
        }
    } else {
        // Before 1.25 there is no (GA) maxSurge (and with a host port no room for a surge
        // pod); maxUnavailable must be at least 1: the agent's static copy holds the node
        // while its DaemonSet pod is replaced.
        RollingUpdateDaemonSet {
            max_surge: None,
            max_unavailable: Some(IntOrString::Int(1)),
        }
    };
    let mut hashed = options.agent_config();
    hashed.push_str(&api_kubeconfig(&options.api).unwrap_or_default());
    let template_annotations = BTreeMap::from([
        // It checkpoints itself: the static copy that restarts it after a reboot.
        (CHECKPOINT_ANNOTATION.to_owned(), "true".to_owned()),
        (CONFIG_HASH_ANNOTATION.to_owned(), config_hash(&hashed)),
    ]);
    DaemonSet {
        metadata: namespaced_meta(NAME, &options.namespace),
        spec: DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(labels()),
                ..LabelSelector::default()
            },
            update_strategy: Some(DaemonSetUpdateStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(update),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels()),
                    annotations: Some(template_annotations),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod_spec(options)),
            },
            ..DaemonSetSpec::default()
        },
        ..DaemonSet::default()
    }
}

/// The volumes and where the container mounts them.
fn volumes_and_mounts(options: &ManifestOptions) -> (Vec<Volume>, Vec<VolumeMount>) {
    let mut volumes = vec![config_map_volume("config", NAME)];
    let mut mounts = vec![mount("config", CONFIG_DIR, true)];
    if options.api != ApiEndpoint::InCluster {
        volumes.push(config_map_volume("kubeconfig", KUBECONFIG_NAME));
        mounts.push(mount("kubeconfig", KUBECONFIG_DIR, true));
    }
    volumes.push(Volume {
        name: "health".into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            size_limit: Some(Quantity("1Mi".into())),
            ..EmptyDirVolumeSource::default()
        }),
        ..Volume::default()
    });
    mounts.push(mount("health", HEALTH_DIR, false));
    // Same paths inside as on the host: the static manifests the agent writes refer to
    // the checkpointed data by their host paths.
    // `Directory`: a wrong --manifests-dir is a pod that cannot start, not an agent writing
    // checkpoints into a directory no kubelet reads.
    volumes.push(host_path_volume(
        "manifests-dir",
        &options.manifests_dir,
        "Directory",
    ));
    mounts.push(mount("manifests-dir", &options.manifests_dir, false));
    for dir in CHECKPOINT_SUBDIRS {
        let name = if dir == Layout::AGENT_DIR_NAME {
            "agent-state".to_owned()
        } else {
            format!("data-{}", dir.trim_start_matches("checkpoint-"))
        };
        let path = format!("{CHECKPOINT_DIR}/{dir}");
        volumes.push(host_path_volume(&name, &path, "DirectoryOrCreate"));
        mounts.push(mount(&name, &path, false));
    }
    // LOCK DIR: the lock file's directory; its location is the lock's owner's to choose.
    let lock_dir = parent_dir(&options.lock_file).unwrap_or("/");
    volumes.push(host_path_volume(LOCK_DIR_VOLUME, lock_dir, "DirectoryOrCreate"));
    mounts.push(mount(LOCK_DIR_VOLUME, lock_dir, false));
    if let Some(dir) = options
        .runtime_endpoint
        .strip_prefix("unix://")
        .and_then(parent_dir)
    {
        // The socket's directory, not the socket: a runtime restart re-creates the socket,
        // and a bind mount of the old one would stay dead. Read-only still allows connect.
        // `Directory`: a wrong --runtime-endpoint is a pod that cannot start, not an agent
        // that silently runs without the CRI.
        volumes.push(host_path_volume("cri-socket-dir", dir, "Directory"));
        mounts.push(mount("cri-socket-dir", dir, true));
    }
    if let KubeletTrust::Ca(path) = &options.kubelet {
        // The one file, read-only: never the directory it is in (often pki/).
        volumes.push(host_path_volume("kubelet-ca", path, "File"));
        mounts.push(mount("kubelet-ca", path, true));
    }
    (volumes, mounts)
}

fn pod_spec(options: &ManifestOptions) -> PodSpec {
    let (volumes, mounts) = volumes_and_mounts(options);
    let probe = |flag: &str, period: i32| Probe {
        exec: Some(ExecAction {
            command: Some(
                [AGENT_BINARY, "health", flag, "--health-socket", &health_socket()]
                    .map(str::to_owned)
                    .to_vec(),
            ),
        }),
        period_seconds: Some(period),
        timeout_seconds: Some(3),
        failure_threshold: Some(3),
        ..Probe::default()
    };
    let mut args = ["run", "--config", &format!("{CONFIG_DIR}/{CONFIG_KEY}")]
        .map(str::to_owned)
        .to_vec();
    if options.api != ApiEndpoint::InCluster {
        args.extend([
            "--kubeconfig".to_owned(),
            format!("{KUBECONFIG_DIR}/{KUBECONFIG_KEY}"),
        ]);
    }
    // The kubelet expands $(HOST_IP) from the env below, for the static copy too.
    if let Some(port) = options.prometheus_port {
        args.push(format!("--metrics-listen=$(HOST_IP):{port}"));
    }
    let ports = options.prometheus_port.map(|port| {
        vec![ContainerPort {
            name: Some(monitoring::PORT_NAME.into()),
            container_port: i32::from(port),
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        }]
    });
    PodSpec {
        service_account_name: Some(NAME.into()),
        // The static copy must come up before any network plugin after a reboot.
        host_network: Some(true),
        priority_class_name: options.priority_class.clone(),
        image_pull_secrets: (!options.image_pull_secrets.is_empty()).then(|| {
            (options.image_pull_secrets.iter())
                .map(|name| LocalObjectReference { name: name.clone() })
                .collect()
        }),
        // The nodes with any of the labels (control-plane ones unless --only-node-labels):
        // terms of a node affinity are ORed.
        affinity: Some(Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: (options.node_labels.iter())
                        .map(|label| NodeSelectorTerm {
                            match_expressions: Some(vec![NodeSelectorRequirement {
                                key: label.key.clone(),
                                operator: if label.value.is_some() { "In" } else { "Exists" }.into(),
                                values: label.value.clone().map(|v| vec![v]),
                            }]),
                            ..NodeSelectorTerm::default()
                        })
                        .collect(),
                }),
                ..NodeAffinity::default()
            }),
            ..Affinity::default()
        }),
        tolerations: Some(vec![Toleration {
            operator: Some("Exists".into()),
            ..Toleration::default()
        }]),
        security_context: Some(PodSecurityContext {
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..SeccompProfile::default()
            }),
            ..PodSecurityContext::default()
        }),
        containers: vec![Container {
            name: NAME.into(),
            image: Some(options.image.clone()),
            // Restarting offline must not depend on a registry.
            image_pull_policy: Some("IfNotPresent".into()),
            args: Some(args),
            ports,
            env: Some(vec![
                field_env("NODE_NAME", "spec.nodeName"),
                field_env("POD_NAME", "metadata.name"),
                field_env("POD_NAMESPACE", "metadata.namespace"),
                // The kubelet API is https://$HOST_IP:10250.
                field_env("HOST_IP", "status.hostIP"),
            ]),
            volume_mounts: Some(mounts),
            liveness_probe: Some(probe("--live", 10)),
            readiness_probe: Some(probe("--ready", 5)),
            resources: Some(ResourceRequirements {
                requests: Some(BTreeMap::from([
                    ("cpu".to_owned(), Quantity("10m".into())),
                    ("memory".to_owned(), Quantity(MEMORY_REQUEST.into())),
                ])),
                limits: (options.memory_limit.as_ref())
                    .map(|limit| BTreeMap::from([("memory".to_owned(), Quantity(limit.clone()))])),
                ..ResourceRequirements::default()
            }),
            security_context: Some(SecurityContext {
                run_as_user: Some(0),
                read_only_root_filesystem: Some(true),
                allow_privilege_escalation: Some(false),
                capabilities: Some(Capabilities {
                    drop: Some(vec!["ALL".into()]),
                    add: Some(CAPABILITIES.map(str::to_owned).to_vec()),
                }),
                ..SecurityContext::default()
            }),
            ..Container::default()
        }],
        volumes: Some(volumes),
        ..PodSpec::default()
    }
}

fn field_env(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: field_path.into(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

fn config_map_volume(name: &str, config_map: &str) -> Volume {
    Volume {
        name: name.into(),
        config_map: Some(ConfigMapVolumeSource {
            name: config_map.into(),
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    }
}

fn host_path_volume(name: &str, path: &str, type_: &str) -> Volume {
    Volume {
        name: name.into(),
        host_path: Some(HostPathVolumeSource {
            path: path.into(),
            type_: Some(type_.into()),
        }),
        ..Volume::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    }
}

/// `text` double-quoted as JSON writes it (YAML reads it alike), as the Helm chart's `quote`
/// does for the text a config holds: a value that looks like a number or a boolean stays a
/// string.
fn quoted(text: &str) -> String {
    serde_json::Value::from(text).to_string()
}

/// The first 16 hex digits of the SHA-256 of the config and kubeconfig text: stable
/// across releases (std's hasher may change, which would churn the checked-in manifests),
/// and what the Helm chart computes with `sha256sum | trunc 16`.
fn config_hash(text: &str) -> String {
    (Sha256::digest(text.as_bytes()).iter().take(8))
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl ManifestOptions {
    /// The DaemonSet's rollout starts the new pod before the old one stops (`maxSurge: 1`):
    /// from 1.25 on, unless a declared metrics port reserves the host port, so a surge pod
    /// would never fit beside the old one ("didn't have free ports", kubernetes#106417) and
    /// every upgrade would hang. Otherwise the old pod goes first and the static copy holds
    /// the node meanwhile.
    pub fn rolls_with_surge(&self) -> bool {
        self.kubernetes_version.has_daemonset_max_surge() && self.prometheus_port.is_none()
    }

    /// The agent's `--config` file: the long flag names without dashes. Every string the
    /// flags chose is double-quoted (as JSON writes it, which YAML reads), so a value that
    /// looks like a number or a boolean stays a string, and the Helm chart's `quote` writes
    /// the same bytes (the config hash is over them).
    pub fn agent_config(&self) -> String {
        let mut out = format!(
            "# pod-checkpointer run --config: the keys are its long flag names (see --help).\n\
             # NODE_NAME, POD_NAME, POD_NAMESPACE and HOST_IP come from the pod's environment.\n\
             apiVersion: {CONFIG_API_VERSION}\n\
             kind: {CONFIG_KIND}\n"
        );
        let line = |out: &mut String, key: &str, value: String| out.push_str(&format!("{key}: {value}\n"));
        line(&mut out, "gc-strategy", quoted(&self.gc_strategy));
        line(&mut out, "checkpoint-grace-period", quoted(&self.grace_period));
        line(&mut out, "revisions", self.revisions.to_string());
        line(&mut out, "handoff-timeout", quoted(&self.handoff_timeout));
        out.push_str("namespaces:\n");
        for ns in &self.namespaces {
            out.push_str(&format!("- {}\n", quoted(ns)));
        }
        line(&mut out, "checkpoint-dir", quoted(CHECKPOINT_DIR));
        line(&mut out, "manifests-dir", quoted(&self.manifests_dir));
        line(&mut out, "lock-file", quoted(&self.lock_file));
        line(&mut out, "runtime-endpoint", quoted(&self.runtime_endpoint));
        match &self.kubelet {
            KubeletTrust::Ca(path) => line(&mut out, "kubelet-ca", quoted(path)),
            KubeletTrust::Insecure => line(&mut out, "kubelet-insecure", "true".to_owned()),
            KubeletTrust::NotUsed => {}
        }
        line(
            &mut out,
            "metrics-addr",
            quoted(&format!("127.0.0.1:{}", self.metrics_port)),
        );
        line(&mut out, "health-socket", quoted(&health_socket()));
        // Written out so operators find where to turn on debug logs for both copies.
        line(&mut out, "log-level", quoted(&self.log_level));
        line(&mut out, "log-format", quoted(self.log_format.as_str()));
        out
    }
}
