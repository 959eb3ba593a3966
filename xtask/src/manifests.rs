//! The Kubernetes objects that install pod-checkpointer, built as typed k8s-openapi values
//! (ARCHITECTURE.md, Deployment): what `cargo xtask render` writes and `cargo xtask deploy` applies.
//!
//! Least privilege: each RBAC rule says why the agent needs it. The choices that depend on
//! the cluster's Kubernetes version (DaemonSet `maxSurge`, `nodes/pods` vs `nodes/proxy`)
//! follow [`KubernetesVersion`], which `deploy` reads from the cluster.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, RollingUpdateDaemonSet};
use k8s_openapi::api::core::v1::{
    Affinity, ConfigMap, ConfigMapVolumeSource, Container, EnvVar, EnvVarSource, HTTPGetAction,
    HostPathVolumeSource, Namespace, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    ObjectFieldSelector, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SecurityContext,
    ServiceAccount, Toleration, Volume, VolumeMount,
};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::ApiResource;
use serde::Serialize;

/// The name of every object (ServiceAccount, roles, bindings, ConfigMap, DaemonSet).
pub(crate) const NAME: &str = "pod-checkpointer";
/// The static copy's ServiceAccount (the agent's `--static-service-account` default).
pub(crate) const STATIC_NAME: &str = "pod-checkpointer-static";
/// The Role that lets the agent mint tokens for [`STATIC_NAME`] only.
const TOKEN_ROLE_NAME: &str = "pod-checkpointer-token";
/// The label that selects the DaemonSet's pods (and marks every object we install).
const NAME_LABEL: &str = "app.kubernetes.io/name";
/// Marks a pod for checkpointing; on the agent's own template it checkpoints itself.
const CHECKPOINT_ANNOTATION: &str = "checkpointer.alpha.coreos.com/checkpoint";
/// A hash of the agent's config on the pod template, so a changed config rolls the pods
/// (the agent reads its config only at start).
const CONFIG_HASH_ANNOTATION: &str = "checkpointer.alpha.coreos.com/config-hash";
/// Where the ConfigMap is mounted, and its key.
const CONFIG_DIR: &str = "/etc/pod-checkpointer";
const CONFIG_KEY: &str = "config.yaml";

pub(crate) const DEFAULT_NAMESPACE: &str = "kube-system";
pub(crate) const DEFAULT_IMAGE: &str = concat!(
    "ghcr.io/pod-checkpointer/pod-checkpointer:",
    env!("CARGO_PKG_VERSION")
);
pub(crate) const DEFAULT_GRACE_PERIOD: &str = "1m";
pub(crate) const DEFAULT_RUNTIME_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";
pub(crate) const DEFAULT_CHECKPOINT_DIR: &str = "/etc/kubernetes";
pub(crate) const DEFAULT_MANIFESTS_DIR: &str = "/etc/kubernetes/manifests";
pub(crate) const DEFAULT_LOCK_FILE: &str = "/var/run/lock/pod-checkpointer.lock";
/// Health and metrics on loopback: with `hostNetwork` the kubelet's probes reach it there,
/// and nothing off the node does. The port is one no core component uses.
pub(crate) const DEFAULT_METRICS_PORT: u16 = 10266;

/// A Kubernetes `major.minor` version: the oldest API server or kubelet the manifests
/// must work with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct KubernetesVersion {
    pub(crate) major: u32,
    pub(crate) minor: u32,
}

impl KubernetesVersion {
    /// The API level of the workspace's k8s-openapi feature (`v1_33`).
    pub(crate) const NEWEST: KubernetesVersion = KubernetesVersion::new(1, 33);

    pub(crate) const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }

    /// DaemonSet `maxSurge` is GA since 1.25 (alpha 1.21, beta 1.22); before that the
    /// field is unknown or may be gated off.
    pub(crate) fn has_daemonset_max_surge(self) -> bool {
        self >= KubernetesVersion::new(1, 25)
    }

    /// Kubelets from 1.33 on authorize `GET /pods` as `nodes/pods` (KEP-2862,
    /// KubeletFineGrainedAuthz); older ones only as `nodes/proxy`.
    pub(crate) fn kubelet_authorizes_nodes_pods(self) -> bool {
        self >= KubernetesVersion::new(1, 33)
    }

    /// From the API server's `/version` fields (`minor` may read `20+`).
    pub(crate) fn from_version_info(major: &str, minor: &str) -> anyhow::Result<Self> {
        format!("{}.{}", major.trim_end_matches('+'), minor.trim_end_matches('+')).parse()
    }
}

impl FromStr for KubernetesVersion {
    type Err = anyhow::Error;

    /// `1.20`, `v1.20`, `1.20.2`, `v1.33.1+k3s1`.
    fn from_str(text: &str) -> anyhow::Result<Self> {
        let invalid = || format!("invalid Kubernetes version {text:?} (use MAJOR.MINOR, e.g. 1.20)");
        let mut parts = text.trim().trim_start_matches('v').split(['.', '+', '-']);
        let major = parts.next().unwrap_or("").parse().with_context(invalid)?;
        let minor = parts.next().unwrap_or("").parse().with_context(invalid)?;
        Ok(KubernetesVersion::new(major, minor))
    }
}

impl fmt::Display for KubernetesVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The flags `render` and `deploy` share.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct ManifestArgs {
    /// GC strategy of the agent (see `pod-checkpointer strategies`)
    #[arg(long, value_name = "NAME", default_value = ckpt_gc::DEFAULT_STRATEGY)]
    pub(crate) gc_strategy: String,
    /// How long a parent must be gone before its checkpoint is removed, e.g. 30s, 5m
    #[arg(long, value_name = "DURATION", default_value = DEFAULT_GRACE_PERIOD)]
    pub(crate) grace_period: String,
    /// Namespaces whose pods may be checkpointed; the install namespace is always included
    #[arg(long, value_name = "NS[,NS…]", value_delimiter = ',')]
    pub(crate) namespaces: Vec<String>,
    /// Namespace the agent is installed in (created unless it is kube-system)
    #[arg(long, value_name = "NS", default_value = DEFAULT_NAMESPACE)]
    pub(crate) namespace: String,
    /// Container image of the agent (see the Containerfile)
    #[arg(long, value_name = "IMAGE", default_value = DEFAULT_IMAGE)]
    pub(crate) image: String,
    /// The container runtime's CRI socket on the nodes; "" runs the agent without the CRI
    #[arg(long, value_name = "URL", default_value = DEFAULT_RUNTIME_ENDPOINT)]
    pub(crate) runtime_endpoint: String,
    /// The kubelet's static pod directory on the nodes
    #[arg(long, value_name = "DIR", default_value = DEFAULT_MANIFESTS_DIR)]
    pub(crate) manifests_dir: String,
    /// Loopback port of the agent's /healthz, /readyz and /metrics
    #[arg(long, value_name = "PORT", default_value_t = DEFAULT_METRICS_PORT)]
    pub(crate) metrics_port: u16,
    /// Oldest Kubernetes version among the API server and kubelets, MAJOR.MINOR: below 1.25
    /// the DaemonSet updates without maxSurge, below 1.33 the kubelet API is authorized as
    /// nodes/proxy instead of nodes/pods [render default: 1.33; deploy: read from the cluster]
    #[arg(long, value_name = "VERSION")]
    pub(crate) kubernetes_version: Option<KubernetesVersion>,
    /// Also bind the agent's roles to this user, e.g. an agent run outside the cluster with
    /// a kubeconfig of its own (repeatable)
    #[arg(long, value_name = "USER")]
    pub(crate) bind_user: Vec<String>,
}

impl Default for ManifestArgs {
    fn default() -> Self {
        Self {
            gc_strategy: ckpt_gc::DEFAULT_STRATEGY.to_owned(),
            grace_period: DEFAULT_GRACE_PERIOD.to_owned(),
            namespaces: Vec::new(),
            namespace: DEFAULT_NAMESPACE.to_owned(),
            image: DEFAULT_IMAGE.to_owned(),
            runtime_endpoint: DEFAULT_RUNTIME_ENDPOINT.to_owned(),
            manifests_dir: DEFAULT_MANIFESTS_DIR.to_owned(),
            metrics_port: DEFAULT_METRICS_PORT,
            kubernetes_version: None,
            bind_user: Vec::new(),
        }
    }
}

/// Checked settings for [`render`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ManifestOptions {
    pub(crate) gc_strategy: String,
    pub(crate) grace_period: String,
    /// Sorted, deduplicated, with the install namespace.
    pub(crate) namespaces: Vec<String>,
    pub(crate) namespace: String,
    pub(crate) image: String,
    pub(crate) runtime_endpoint: String,
    pub(crate) manifests_dir: String,
    pub(crate) metrics_port: u16,
    pub(crate) kubernetes_version: KubernetesVersion,
    pub(crate) bind_users: Vec<String>,
}

impl ManifestArgs {
    /// Checks the flags the way the agent will check its config, before anything is
    /// rendered or sent; `version` stands in when `--kubernetes-version` is not given.
    pub(crate) fn options(&self, version: KubernetesVersion) -> anyhow::Result<ManifestOptions> {
        check_strategy(&self.gc_strategy)?;
        ensure!(
            ckpt_core::is_dns_label(&self.namespace),
            "--namespace: {:?} is not a valid namespace name",
            self.namespace
        );
        let mut namespaces: Vec<String> = self
            .namespaces
            .iter()
            .map(|ns| ns.trim().to_owned())
            .filter(|ns| !ns.is_empty())
            .collect();
        // The agent checkpoints itself, so it must see its own namespace.
        namespaces.push(self.namespace.clone());
        namespaces.sort();
        namespaces.dedup();
        if let Some(bad) = namespaces.iter().find(|ns| !ckpt_core::is_dns_label(ns)) {
            bail!("--namespaces: {bad:?} is not a valid namespace name");
        }
        ensure!(!self.image.trim().is_empty(), "--image must not be empty");
        ensure!(
            self.manifests_dir.starts_with('/'),
            "--manifests-dir: {:?} is not an absolute path",
            self.manifests_dir
        );
        if !self.runtime_endpoint.is_empty() {
            let socket = self.runtime_endpoint.strip_prefix("unix://");
            ensure!(
                socket.is_some_and(|path| path.starts_with('/') && parent_dir(path).is_some()),
                "--runtime-endpoint: {:?} is not a unix socket like unix:///run/containerd/containerd.sock (or \"\" for none)",
                self.runtime_endpoint
            );
        }
        let mut bind_users = self.bind_user.clone();
        bind_users.sort();
        bind_users.dedup();
        let options = ManifestOptions {
            gc_strategy: self.gc_strategy.clone(),
            grace_period: self.grace_period.trim().to_owned(),
            namespaces,
            namespace: self.namespace.clone(),
            image: self.image.trim().to_owned(),
            runtime_endpoint: self.runtime_endpoint.clone(),
            manifests_dir: self.manifests_dir.clone(),
            metrics_port: self.metrics_port,
            kubernetes_version: self.kubernetes_version.unwrap_or(version),
            bind_users,
        };
        // The agent's own parser: a config it would refuse (a bad duration, strategy
        // settings) never reaches a cluster.
        ckpt_bin::config::check_config_file(&options.agent_config()).map_err(|e| {
            anyhow::anyhow!(
                "the agent would refuse this config: {}",
                ckpt_core::error_chain(&e)
            )
        })?;
        Ok(options)
    }
}

/// Rejects a strategy the agent does not know, naming the ones it does.
pub(crate) fn check_strategy(name: &str) -> anyhow::Result<()> {
    let known = ckpt_gc::names();
    ensure!(
        known.contains(&name),
        "--gc-strategy: unknown strategy {name:?}; registered strategies: {}",
        known.join(", ")
    );
    Ok(())
}

/// One object of the install, in apply order.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub(crate) enum Manifest {
    Namespace(Namespace),
    ServiceAccount(ServiceAccount),
    ConfigMap(ConfigMap),
    ClusterRole(ClusterRole),
    ClusterRoleBinding(ClusterRoleBinding),
    Role(Role),
    RoleBinding(RoleBinding),
    /// Boxed: it is several times the size of the others.
    DaemonSet(Box<DaemonSet>),
}

impl Manifest {
    pub(crate) fn metadata(&self) -> &ObjectMeta {
        match self {
            Manifest::Namespace(o) => &o.metadata,
            Manifest::ServiceAccount(o) => &o.metadata,
            Manifest::ConfigMap(o) => &o.metadata,
            Manifest::ClusterRole(o) => &o.metadata,
            Manifest::ClusterRoleBinding(o) => &o.metadata,
            Manifest::Role(o) => &o.metadata,
            Manifest::RoleBinding(o) => &o.metadata,
            Manifest::DaemonSet(o) => &o.metadata,
        }
    }

    pub(crate) fn name(&self) -> &str {
        self.metadata().name.as_deref().unwrap_or_default()
    }

    pub(crate) fn namespace(&self) -> Option<&str> {
        self.metadata().namespace.as_deref()
    }

    /// Group, version, kind and plural, for a dynamic API client.
    pub(crate) fn api_resource(&self) -> ApiResource {
        match self {
            Manifest::Namespace(_) => ApiResource::erase::<Namespace>(&()),
            Manifest::ServiceAccount(_) => ApiResource::erase::<ServiceAccount>(&()),
            Manifest::ConfigMap(_) => ApiResource::erase::<ConfigMap>(&()),
            Manifest::ClusterRole(_) => ApiResource::erase::<ClusterRole>(&()),
            Manifest::ClusterRoleBinding(_) => ApiResource::erase::<ClusterRoleBinding>(&()),
            Manifest::Role(_) => ApiResource::erase::<Role>(&()),
            Manifest::RoleBinding(_) => ApiResource::erase::<RoleBinding>(&()),
            Manifest::DaemonSet(_) => ApiResource::erase::<DaemonSet>(&()),
        }
    }

    /// `DaemonSet kube-system/pod-checkpointer`, `ClusterRole pod-checkpointer`.
    pub(crate) fn describe(&self) -> String {
        let kind = self.api_resource().kind;
        match self.namespace() {
            Some(ns) => format!("{kind} {ns}/{}", self.name()),
            None => format!("{kind} {}", self.name()),
        }
    }
}

/// Every object of the install, in the order they must be applied (namespace and identity
/// first, the DaemonSet whose pods use them last).
pub(crate) fn render(options: &ManifestOptions) -> Vec<Manifest> {
    let mut objects = Vec::new();
    if options.namespace != DEFAULT_NAMESPACE {
        objects.push(Manifest::Namespace(Namespace {
            metadata: cluster_meta(&options.namespace),
            ..Namespace::default()
        }));
    }
    objects.push(Manifest::ServiceAccount(ServiceAccount {
        metadata: namespaced_meta(NAME, &options.namespace),
        ..ServiceAccount::default()
    }));
    // The static copy's identity: the agent keeps tokens of this account for it; it reads
    // what the agent reads, but may not mint tokens (ARCHITECTURE.md, Credentials).
    objects.push(Manifest::ServiceAccount(ServiceAccount {
        metadata: namespaced_meta(STATIC_NAME, &options.namespace),
        ..ServiceAccount::default()
    }));
    objects.push(Manifest::ConfigMap(ConfigMap {
        metadata: namespaced_meta(NAME, &options.namespace),
        data: Some(BTreeMap::from([(CONFIG_KEY.to_owned(), options.agent_config())])),
        ..ConfigMap::default()
    }));
    objects.push(Manifest::ClusterRole(ClusterRole {
        metadata: cluster_meta(NAME),
        rules: Some(vec![
            kubelet_api_rule(options.kubernetes_version),
            // Its own node, read only when its own pod is gone, to tell a rollout (the
            // DaemonSet still targets the node: keep everything) from a descheduling
            // (self-GC). A ClusterRole cannot name each node; `get` only.
            rule(&[""], &["nodes"], &["get"]),
        ]),
        ..ClusterRole::default()
    }));
    objects.push(Manifest::ClusterRoleBinding(ClusterRoleBinding {
        metadata: cluster_meta(NAME),
        role_ref: role_ref("ClusterRole"),
        subjects: Some(subjects(options)),
    }));
    for ns in &options.namespaces {
        objects.push(Manifest::Role(Role {
            metadata: namespaced_meta(NAME, ns),
            rules: Some(namespace_rules()),
        }));
        objects.push(Manifest::RoleBinding(RoleBinding {
            metadata: namespaced_meta(NAME, ns),
            role_ref: role_ref("Role"),
            subjects: Some(subjects(options)),
        }));
    }
    // Tokens of the static copy's account only, for the kubeconfig the agent keeps for its
    // static copy (which has no token of its own, and must still self-GC); bound to the
    // agent's account alone, so the static copy cannot renew its own access.
    objects.push(Manifest::Role(Role {
        metadata: namespaced_meta(TOKEN_ROLE_NAME, &options.namespace),
        rules: Some(vec![PolicyRule {
            resource_names: Some(vec![STATIC_NAME.to_owned()]),
            ..rule(&[""], &["serviceaccounts/token"], &["create"])
        }]),
    }));
    objects.push(Manifest::RoleBinding(RoleBinding {
        metadata: namespaced_meta(TOKEN_ROLE_NAME, &options.namespace),
        role_ref: RoleRef {
            name: TOKEN_ROLE_NAME.into(),
            ..role_ref("Role")
        },
        subjects: Some(agent_subjects(options)),
    }));
    objects.push(Manifest::DaemonSet(Box::new(daemonset(options))));
    objects
}

/// What `cargo xtask render` prints: a header, then one YAML document per object.
pub(crate) fn to_yaml(objects: &[Manifest]) -> anyhow::Result<String> {
    let mut out = String::from(
        "# pod-checkpointer: ServiceAccount, RBAC, agent config and DaemonSet.\n\
         # Generated by `cargo xtask render` (do not edit; pass flags to change it).\n",
    );
    for (index, object) in objects.iter().enumerate() {
        if index > 0 {
            out.push_str("---\n");
        }
        out.push_str(
            &serde_saphyr::to_string(object)
                .with_context(|| format!("cannot write {}", object.describe()))?,
        );
    }
    Ok(out)
}

impl ManifestOptions {
    /// The agent's `--config` file: the long flag names without dashes (ARCHITECTURE.md, Command-line contract).
    pub(crate) fn agent_config(&self) -> String {
        #[derive(Serialize)]
        #[serde(rename_all = "kebab-case")]
        struct AgentConfig<'a> {
            gc_strategy: &'a str,
            checkpoint_grace_period: &'a str,
            namespaces: &'a [String],
            checkpoint_dir: &'a str,
            manifests_dir: &'a str,
            lock_file: &'a str,
            runtime_endpoint: &'a str,
            metrics_addr: String,
        }
        let config = AgentConfig {
            gc_strategy: &self.gc_strategy,
            checkpoint_grace_period: &self.grace_period,
            namespaces: &self.namespaces,
            checkpoint_dir: DEFAULT_CHECKPOINT_DIR,
            manifests_dir: &self.manifests_dir,
            lock_file: DEFAULT_LOCK_FILE,
            runtime_endpoint: &self.runtime_endpoint,
            metrics_addr: format!("127.0.0.1:{}", self.metrics_port),
        };
        let body = serde_saphyr::to_string(&config).expect("a struct of strings serializes");
        format!(
            "# pod-checkpointer run --config: the keys are its long flag names (see --help).\n\
             # NODE_NAME, POD_NAME, POD_NAMESPACE and HOST_IP come from the pod's environment.\n{body}"
        )
    }
}

fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([(NAME_LABEL.to_owned(), NAME.to_owned())])
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

fn role_ref(kind: &str) -> RoleRef {
    RoleRef {
        api_group: "rbac.authorization.k8s.io".into(),
        kind: kind.into(),
        name: NAME.into(),
    }
}

/// The agent's account and the bound users, then the static copy's account.
fn subjects(options: &ManifestOptions) -> Vec<Subject> {
    let mut subjects = agent_subjects(options);
    subjects.push(Subject {
        kind: "ServiceAccount".into(),
        name: STATIC_NAME.into(),
        namespace: Some(options.namespace.clone()),
        ..Subject::default()
    });
    subjects
}

/// The agent's account and the bound users.
fn agent_subjects(options: &ManifestOptions) -> Vec<Subject> {
    let service_account = Subject {
        kind: "ServiceAccount".into(),
        name: NAME.into(),
        namespace: Some(options.namespace.clone()),
        ..Subject::default()
    };
    let users = options.bind_users.iter().map(|user| Subject {
        api_group: Some("rbac.authorization.k8s.io".into()),
        kind: "User".into(),
        name: user.clone(),
        ..Subject::default()
    });
    std::iter::once(service_account).chain(users).collect()
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

/// The agent reads its node's pods from the kubelet (`GET /pods`), which asks the API
/// server whether the caller may: as `nodes/pods` from 1.33 on, `nodes/proxy` before.
/// `nodes/proxy` also allows exec into any pod on the node, so it is granted only where
/// the kubelet knows nothing narrower.
fn kubelet_api_rule(version: KubernetesVersion) -> PolicyRule {
    let subresource = if version.kubelet_authorizes_nodes_pods() {
        "nodes/pods"
    } else {
        "nodes/proxy"
    };
    rule(&[""], &[subresource], &["get"])
}

/// What the agent (and its static copy) does in each namespace it checkpoints:
fn namespace_rules() -> Vec<PolicyRule> {
    vec![
        // A watch of the pods on its node (field selector spec.nodeName): the parents.
        rule(&[""], &["pods"], &["get", "list", "watch"]),
        // The Secrets and ConfigMaps checkpointed pods mount, each watched by name so a
        // change is rewritten at once and nothing is polled.
        rule(&[""], &["secrets", "configmaps"], &["get", "list", "watch"]),
        // Events on the parent pods (activated, deactivated, removed, refused); kube's
        // recorder writes events.k8s.io/v1 Events only, and patches repeated ones.
        rule(&["events.k8s.io"], &["events"], &["create", "patch"]),
        // The owner-reference strategy GETs a parent's controller owner to tell "deleted"
        // from "moved", and the agent GETs its own DaemonSet when its own pod is gone (a
        // rollout or a descheduling?). Only controllers that own pods directly:
        // Deployments and CronJobs own ReplicaSets and Jobs, never pods.
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
    let update = if options.kubernetes_version.has_daemonset_max_surge() {
        // The new pod starts (and checkpoints itself) before the old one stops, so no node
        // is ever without a running agent.
        RollingUpdateDaemonSet {
            max_surge: Some(IntOrString::Int(1)),
            max_unavailable: Some(IntOrString::Int(0)),
        }
    } else {
        // Before 1.25 there is no (GA) maxSurge and maxUnavailable must be at least 1; the
        // agent's static copy holds the node while its DaemonSet pod is replaced.
        RollingUpdateDaemonSet {
            max_surge: None,
            max_unavailable: Some(IntOrString::Int(1)),
        }
    };
    let config = options.agent_config();
    let template_annotations = BTreeMap::from([
        // It checkpoints itself: the static copy that restarts it after a reboot.
        (CHECKPOINT_ANNOTATION.to_owned(), "true".to_owned()),
        (
            CONFIG_HASH_ANNOTATION.to_owned(),
            format!("{:016x}", fnv1a64(config.as_bytes())),
        ),
    ]);
    DaemonSet {
        metadata: namespaced_meta(NAME, &options.namespace),
        spec: Some(DaemonSetSpec {
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
        }),
        ..DaemonSet::default()
    }
}

fn pod_spec(options: &ManifestOptions) -> PodSpec {
    let mut volumes = vec![
        config_map_volume("config", NAME),
        host_path_volume("checkpoint-dir", DEFAULT_CHECKPOINT_DIR, "DirectoryOrCreate"),
        host_path_volume("manifests-dir", &options.manifests_dir, "DirectoryOrCreate"),
        host_path_volume("lock-dir", lock_dir(), "DirectoryOrCreate"),
    ];
    let mut mounts = vec![
        mount("config", CONFIG_DIR, true),
        // Same paths inside as on the host: the static manifests the agent writes refer to
        // the checkpointed secrets by their host paths.
        mount("checkpoint-dir", DEFAULT_CHECKPOINT_DIR, false),
        mount("manifests-dir", &options.manifests_dir, false),
        mount("lock-dir", lock_dir(), false),
    ];
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
    let metrics_port = IntOrString::Int(i32::from(options.metrics_port));
    let probe = |path: &str, period: i32| Probe {
        http_get: Some(HTTPGetAction {
            // The agent listens on loopback; with hostNetwork the kubelet probes from there.
            host: Some("127.0.0.1".into()),
            path: Some(path.into()),
            port: metrics_port.clone(),
            scheme: Some("HTTP".into()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        timeout_seconds: Some(2),
        failure_threshold: Some(3),
        ..Probe::default()
    };
    PodSpec {
        service_account_name: Some(NAME.into()),
        // The static copy must come up before any network plugin after a reboot.
        host_network: Some(true),
        priority_class_name: Some("system-node-critical".into()),
        // Control-plane nodes only, by either role label (node-role.kubernetes.io/master
        // before 1.24 and on bootkube clusters): terms of a node affinity are ORed.
        affinity: Some(Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: [
                        "node-role.kubernetes.io/control-plane",
                        "node-role.kubernetes.io/master",
                    ]
                    .into_iter()
                    .map(|key| NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: key.into(),
                            operator: "Exists".into(),
                            values: None,
                        }]),
                        ..NodeSelectorTerm::default()
                    })
                    .collect(),
                }),
                ..NodeAffinity::default()
            }),
            ..Affinity::default()
        }),
        tolerations: Some(
            [
                "node-role.kubernetes.io/control-plane",
                "node-role.kubernetes.io/master",
            ]
            .into_iter()
            .map(|key| Toleration {
                key: Some(key.into()),
                operator: Some("Exists".into()),
                effect: Some("NoSchedule".into()),
                ..Toleration::default()
            })
            .collect(),
        ),
        containers: vec![Container {
            name: NAME.into(),
            image: Some(options.image.clone()),
            // Restarting offline must not depend on a registry.
            image_pull_policy: Some("IfNotPresent".into()),
            args: Some(
                ["run", "--config", &format!("{CONFIG_DIR}/{CONFIG_KEY}")]
                    .map(str::to_owned)
                    .to_vec(),
            ),
            env: Some(vec![
                field_env("NODE_NAME", "spec.nodeName"),
                field_env("POD_NAME", "metadata.name"),
                field_env("POD_NAMESPACE", "metadata.namespace"),
                // The kubelet API is https://$HOST_IP:10250.
                field_env("HOST_IP", "status.hostIP"),
            ]),
            volume_mounts: Some(mounts),
            liveness_probe: Some(probe("/healthz", 10)),
            readiness_probe: Some(probe("/readyz", 5)),
            // Requests only: a memory limit that OOM-kills the agent in an outage would
            // take the recovery down with it.
            resources: Some(ResourceRequirements {
                requests: Some(BTreeMap::from([
                    ("cpu".to_owned(), Quantity("10m".into())),
                    ("memory".to_owned(), Quantity("32Mi".into())),
                ])),
                ..ResourceRequirements::default()
            }),
            // Root (it writes static manifests and chowns secrets to the pods' users) but
            // nothing it does not need: all its writes go to the host paths above.
            security_context: Some(SecurityContext {
                read_only_root_filesystem: Some(true),
                allow_privilege_escalation: Some(false),
                ..SecurityContext::default()
            }),
            ..Container::default()
        }],
        volumes: Some(volumes),
        ..PodSpec::default()
    }
}

fn lock_dir() -> &'static str {
    parent_dir(DEFAULT_LOCK_FILE).expect("the lock file has a parent dir")
}

/// `/run/containerd` of `/run/containerd/containerd.sock`; `None` for `/x.sock` (the root
/// dir is never mounted).
fn parent_dir(path: &str) -> Option<&str> {
    path.rsplit_once('/')
        .map(|(dir, _)| dir)
        .filter(|dir| !dir.is_empty())
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

/// FNV-1a: a stable hash with no dependency (std's hasher may change between releases,
/// which would churn the checked-in manifests).
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests;
