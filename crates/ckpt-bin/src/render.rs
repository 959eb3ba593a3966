//! `pod-checkpointer render`: the Kubernetes objects that install pod-checkpointer, built as
//! typed k8s-openapi values and written as YAML, so installing needs the binary and no
//! Rust toolchain. `cargo xtask render` and `cargo xtask deploy` use this module too.
//!
//! - Least privilege: every RBAC rule carries a one-line reason in the YAML; the kubelet
//!   API role exists only when the agent reads the kubelet (`--runtime-endpoint ""`).
//! - The API endpoint: a kubeconfig ConfigMap naming a server chosen at render time
//!   (default the node-local API server), with the pod's service-account token and CA.
//! - Probes per copy: exec probes ask the agent in the same pod over a unix socket in the
//!   pod's own emptyDir, so the other copy (same host network) can never answer for it.
//! - A hardened pod: every capability dropped but the few the agent needs, RuntimeDefault
//!   seccomp, a read-only root, only the host directories the agent writes.
//!
//! The choices that depend on the cluster's Kubernetes version (DaemonSet `maxSurge`,
//! `nodes/pods` vs `nodes/proxy`) follow [`KubernetesVersion`].

mod monitoring;
mod objects;

pub use monitoring::{ALERTS, Alert, expr as alert_expr};

use std::fmt;
use std::str::FromStr;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use serde::Serialize;

use crate::error::{Error, Result};

pub use objects::render;

/// The name of the agent's ServiceAccount and of most objects (roles, bindings, ConfigMap,
/// DaemonSet).
pub const NAME: &str = "pod-checkpointer";
/// The static copy's ServiceAccount: the same read-only roles as the agent's, and no right
/// to mint tokens. The agent mints its tokens (the kept credentials).
pub const STATIC_NAME: &str = "pod-checkpointer-static";
/// The label that selects the DaemonSet's pods (and marks every object we install).
pub const NAME_LABEL: &str = "app.kubernetes.io/name";

pub const DEFAULT_NAMESPACE: &str = "kube-system";
pub const DEFAULT_IMAGE: &str = concat!(
    "ghcr.io/pod-checkpointer/pod-checkpointer:",
    env!("CARGO_PKG_VERSION")
);
pub const DEFAULT_GRACE_PERIOD: &str = "1m";
/// Default `--handoff-timeout` (the agent's own default).
pub const DEFAULT_HANDOFF_TIMEOUT: &str = "2m";
pub const DEFAULT_RUNTIME_ENDPOINT: &str = crate::config::DEFAULT_RUNTIME_ENDPOINT;
pub const DEFAULT_MANIFESTS_DIR: &str = crate::config::DEFAULT_MANIFESTS_DIR;
/// Health and metrics on loopback: nothing off the node reaches them, and the port is one
/// no core component uses (8080 is crowded on control-plane hosts).
pub const DEFAULT_METRICS_PORT: u16 = crate::config::DEFAULT_METRICS_PORT;
/// `--prometheus-port`: next to the loopback port.
pub const DEFAULT_PROMETHEUS_PORT: u16 = 10267;
/// The node-local API server: on a self-hosted control plane the agent runs (hostNetwork)
/// on the node that serves the API, and the `kubernetes` Service's ClusterIP works only
/// once kube-proxy runs, which is itself often self-hosted and checkpointed.
pub const DEFAULT_API_SERVER: &str = "https://127.0.0.1:6443";
/// The name the API server's certificate is checked against when the kubeconfig connects
/// to an address: every API server's serving certificate names its Service `kubernetes`
/// (what in-cluster clients verify), while 127.0.0.1 is not among kubeadm's default SANs.
pub const DEFAULT_API_SERVER_NAME: &str = "kubernetes";
/// `--api-server in-cluster`: the `kubernetes` Service, as kube's in-cluster config finds it.
pub const IN_CLUSTER: &str = "in-cluster";

/// A Kubernetes `major.minor` version: the oldest API server or kubelet the manifests
/// must work with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct KubernetesVersion {
    pub major: u32,
    pub minor: u32,
}

impl KubernetesVersion {
    /// The API level of the workspace's k8s-openapi feature (`v1_33`).
    pub const NEWEST: KubernetesVersion = KubernetesVersion::new(1, 33);

    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }

    /// DaemonSet `maxSurge` is GA since 1.25 (alpha 1.21, beta 1.22); before that the
    /// field is unknown or may be gated off.
    pub fn has_daemonset_max_surge(self) -> bool {
        self >= KubernetesVersion::new(1, 25)
    }

    /// Kubelets from 1.33 on authorize `GET /pods` as `nodes/pods` (KEP-2862,
    /// KubeletFineGrainedAuthz); older ones only as `nodes/proxy`.
    pub fn kubelet_authorizes_nodes_pods(self) -> bool {
        self >= KubernetesVersion::new(1, 33)
    }

    /// From the API server's `/version` fields (`minor` may read `20+`).
    pub fn from_version_info(major: &str, minor: &str) -> Result<Self> {
        format!("{}.{}", major.trim_end_matches('+'), minor.trim_end_matches('+')).parse()
    }
}

impl FromStr for KubernetesVersion {
    type Err = Error;

    /// `1.20`, `v1.20`, `1.20.2`, `v1.33.1+k3s1`.
    fn from_str(text: &str) -> Result<Self> {
        let invalid = || {
            Error::usage_message(format!(
                "invalid Kubernetes version {text:?} (use MAJOR.MINOR, e.g. 1.20)"
            ))
        };
        let mut parts = text.trim().trim_start_matches('v').split(['.', '+', '-']);
        let major = parts.next().unwrap_or("").parse().map_err(|_| invalid())?;
        let minor = parts.next().unwrap_or("").parse().map_err(|_| invalid())?;
        Ok(KubernetesVersion::new(major, minor))
    }
}

impl fmt::Display for KubernetesVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The flags of `pod-checkpointer render` (and `cargo xtask render`/`deploy`).
#[derive(clap::Args, Clone, Debug)]
pub struct ManifestArgs {
    /// GC strategy of the agent (see `pod-checkpointer strategies`)
    #[arg(long, value_name = "NAME", default_value = ckpt_gc::DEFAULT_STRATEGY)]
    pub gc_strategy: String,
    /// How long a parent must be gone before its checkpoint is removed, e.g. 30s, 5m
    #[arg(long, alias = "checkpoint-grace-period", value_name = "DURATION", default_value = DEFAULT_GRACE_PERIOD)]
    pub grace_period: String,
    /// Checkpoints kept per DaemonSet on a node: the newest and known-good ones, which an
    /// activation prefers; 1 keeps only the newest
    #[arg(long, value_name = "N", default_value_t = ckpt_core::revisions::DEFAULT_KEEP)]
    pub revisions: usize,
    /// How long a parent with unproven content has to become Ready once the known-good
    /// checkpoint stepped aside for it, e.g. 90s, 5m
    #[arg(long, value_name = "DURATION", default_value = DEFAULT_HANDOFF_TIMEOUT)]
    pub handoff_timeout: String,
    /// Namespaces whose pods may be checkpointed; the install namespace is always included
    #[arg(long, value_name = "NS[,NS…]", value_delimiter = ',')]
    pub namespaces: Vec<String>,
    /// Namespace the agent is installed in (created unless it is kube-system)
    #[arg(long, value_name = "NS", default_value = DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// Container image of the agent (see the Containerfile)
    #[arg(long, value_name = "IMAGE", default_value = DEFAULT_IMAGE)]
    pub image: String,
    /// The container runtime's CRI socket on the nodes; "" runs the agent without the CRI,
    /// reading the kubelet's /pods instead (then --kubelet-ca or --kubelet-insecure)
    #[arg(long, value_name = "URL", default_value = DEFAULT_RUNTIME_ENDPOINT)]
    pub runtime_endpoint: String,
    /// The kubelet's static pod directory on the nodes
    #[arg(long, value_name = "DIR", default_value = DEFAULT_MANIFESTS_DIR)]
    pub manifests_dir: String,
    /// The lock file both copies share on the nodes (its directory is mounted); while
    /// migrating from bootkube's checkpointer, its /var/run/lock/pod-checkpointer.lock, so
    /// the two exclude each other (README, "Migrating from bootkube's checkpointer")
    #[arg(long, value_name = "PATH", default_value = crate::config::DEFAULT_LOCK_FILE)]
    pub lock_file: String,
    /// Also serve the active copy's metrics on the node's IP at --prometheus-port, and add
    /// a PodMonitor and a PrometheusRule with its alerts (needs the Prometheus operator's
    /// CRDs)
    #[arg(long)]
    pub prometheus: bool,
    /// The node port the active copy's metrics are scraped on, with --prometheus
    #[arg(long, value_name = "PORT", default_value_t = DEFAULT_PROMETHEUS_PORT, requires = "prometheus")]
    pub prometheus_port: u16,
    /// Loopback port of the agent's /healthz, /readyz and /metrics
    #[arg(long, value_name = "PORT", default_value_t = DEFAULT_METRICS_PORT)]
    pub metrics_port: u16,
    /// The API server the agent talks to, an https:// URL, or "in-cluster" for the
    /// `kubernetes` Service (needs kube-proxy) [default: the node-local API server]
    #[arg(long, value_name = "URL|in-cluster", default_value = DEFAULT_API_SERVER)]
    pub api_server: String,
    /// The name the API server's certificate must carry when --api-server is a URL; ""
    /// checks the URL's own host
    #[arg(long, value_name = "NAME", default_value = DEFAULT_API_SERVER_NAME)]
    pub api_server_name: String,
    /// With --runtime-endpoint "": the host file with the CA that signed the kubelets'
    /// serving certificates (mounted read-only, alone)
    #[arg(long, value_name = "FILE")]
    pub kubelet_ca: Option<String>,
    /// With --runtime-endpoint "": do not verify the kubelet's serving certificate (the
    /// service-account token is sent to whatever answers on the kubelet's port)
    #[arg(long, conflicts_with = "kubelet_ca")]
    pub kubelet_insecure: bool,
    /// Oldest Kubernetes version among the API server and kubelets, MAJOR.MINOR: below 1.25
    /// the DaemonSet updates without maxSurge, below 1.33 the kubelet API is authorized as
    /// nodes/proxy instead of nodes/pods [render default: 1.33; deploy: read from the cluster]
    #[arg(long, value_name = "VERSION")]
    pub kubernetes_version: Option<KubernetesVersion>,
    /// Also bind the agent's roles to this user, e.g. an agent run outside the cluster with
    /// a kubeconfig of its own (repeatable)
    #[arg(long, value_name = "USER")]
    pub bind_user: Vec<String>,
}

impl Default for ManifestArgs {
    fn default() -> Self {
        Self {
            gc_strategy: ckpt_gc::DEFAULT_STRATEGY.to_owned(),
            grace_period: DEFAULT_GRACE_PERIOD.to_owned(),
            revisions: ckpt_core::revisions::DEFAULT_KEEP,
            handoff_timeout: DEFAULT_HANDOFF_TIMEOUT.to_owned(),
            namespaces: Vec::new(),
            namespace: DEFAULT_NAMESPACE.to_owned(),
            image: DEFAULT_IMAGE.to_owned(),
            runtime_endpoint: DEFAULT_RUNTIME_ENDPOINT.to_owned(),
            manifests_dir: DEFAULT_MANIFESTS_DIR.to_owned(),
            lock_file: crate::config::DEFAULT_LOCK_FILE.to_owned(),
            prometheus: false,
            prometheus_port: DEFAULT_PROMETHEUS_PORT,
            metrics_port: DEFAULT_METRICS_PORT,
            api_server: DEFAULT_API_SERVER.to_owned(),
            api_server_name: DEFAULT_API_SERVER_NAME.to_owned(),
            kubelet_ca: None,
            kubelet_insecure: false,
            kubernetes_version: None,
            bind_user: Vec::new(),
        }
    }
}

/// How the agent reaches the API server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiEndpoint {
    /// kube's in-cluster config: the `kubernetes` Service (`KUBERNETES_SERVICE_HOST`).
    InCluster,
    /// A kubeconfig ConfigMap naming this server, with the pod's service-account token.
    Server {
        url: String,
        /// `tls-server-name`, when the certificate is checked against another name.
        tls_server_name: Option<String>,
    },
}

/// How the agent trusts the kubelet's serving certificate, when it reads the kubelet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KubeletTrust {
    /// The CRI is on: the kubelet API is not used.
    NotUsed,
    /// `--kubelet-ca`: this host file.
    Ca(String),
    /// `--kubelet-insecure`.
    Insecure,
}

/// Checked settings for [`render`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestOptions {
    pub gc_strategy: String,
    pub grace_period: String,
    pub revisions: usize,
    pub handoff_timeout: String,
    /// Sorted, deduplicated, with the install namespace.
    pub namespaces: Vec<String>,
    pub namespace: String,
    pub image: String,
    pub runtime_endpoint: String,
    pub manifests_dir: String,
    pub lock_file: String,
    pub metrics_port: u16,
    /// `--prometheus`: the node port of the active copy's metrics.
    pub prometheus_port: Option<u16>,
    pub api: ApiEndpoint,
    pub kubelet: KubeletTrust,
    pub kubernetes_version: KubernetesVersion,
    pub bind_users: Vec<String>,
}

impl ManifestArgs {
    /// Checks the flags the way this program's agent will check its config, before
    /// anything is rendered or sent; `version` stands in when `--kubernetes-version` is not
    /// given.
    pub fn options(&self, version: KubernetesVersion) -> Result<ManifestOptions> {
        self.options_for(version, &BuiltIn)
    }

    /// [`ManifestArgs::options`] for the agent that `agent` answers for.
    pub fn options_for(
        &self,
        version: KubernetesVersion,
        agent: &dyn AgentChecks,
    ) -> Result<ManifestOptions> {
        check_strategy(&self.gc_strategy, &agent.strategies()?)?;
        let usage = |message: String| Err(Error::usage_message(message));
        if !ckpt_core::is_dns_label(&self.namespace) {
            return usage(format!(
                "--namespace: {:?} is not a valid namespace name",
                self.namespace
            ));
        }
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
            return usage(format!("--namespaces: {bad:?} is not a valid namespace name"));
        }
        if self.image.trim().is_empty() {
            return usage("--image must not be empty".to_owned());
        }
        if !self.manifests_dir.starts_with('/') {
            return usage(format!(
                "--manifests-dir: {:?} is not an absolute path",
                self.manifests_dir
            ));
        }
        if !self.lock_file.starts_with('/') || parent_dir(&self.lock_file).is_none_or(|dir| dir == "/") {
            return usage(format!(
                "--lock-file: {:?} is not an absolute path in a directory of its own, like /run/pod-checkpointer/pod-checkpointer.lock",
                self.lock_file
            ));
        }
        if !self.runtime_endpoint.is_empty() {
            let socket = self.runtime_endpoint.strip_prefix("unix://");
            if !socket.is_some_and(|path| path.starts_with('/') && parent_dir(path).is_some()) {
                return usage(format!(
                    "--runtime-endpoint: {:?} is not a unix socket like unix:///run/containerd/containerd.sock (or \"\" for none)",
                    self.runtime_endpoint
                ));
            }
        }
        let api = self.api_endpoint()?;
        let kubelet = self.kubelet_trust()?;
        let mut bind_users = self.bind_user.clone();
        bind_users.sort();
        bind_users.dedup();
        let options = ManifestOptions {
            gc_strategy: self.gc_strategy.clone(),
            grace_period: self.grace_period.trim().to_owned(),
            revisions: self.revisions,
            handoff_timeout: self.handoff_timeout.trim().to_owned(),
            namespaces,
            namespace: self.namespace.clone(),
            image: self.image.trim().to_owned(),
            runtime_endpoint: self.runtime_endpoint.clone(),
            manifests_dir: self.manifests_dir.clone(),
            lock_file: self.lock_file.clone(),
            metrics_port: self.metrics_port,
            prometheus_port: self.prometheus.then_some(self.prometheus_port),
            api,
            kubelet,
            kubernetes_version: self.kubernetes_version.unwrap_or(version),
            bind_users,
        };
        // The agent's own parser: a config it would refuse (a bad duration, strategy
        // settings) never reaches a cluster.
        agent.check_config(&options.agent_config()).map_err(|e| {
            Error::usage_message(format!(
                "the agent would refuse this config: {}",
                ckpt_core::error_chain(&e)
            ))
        })?;
        Ok(options)
    }

    fn api_endpoint(&self) -> Result<ApiEndpoint> {
        let url = self.api_server.trim();
        if url == IN_CLUSTER {
            return Ok(ApiEndpoint::InCluster);
        }
        // The service-account token is a bearer credential: never over plain HTTP.
        let host = url
            .strip_prefix("https://")
            .map(|rest| rest.split(['/', ':']).next().unwrap_or(""));
        if host.is_none_or(str::is_empty) || url.contains(char::is_whitespace) {
            return Err(Error::usage_message(format!(
                "--api-server: {url:?} is not an https:// URL like {DEFAULT_API_SERVER} (or {IN_CLUSTER:?})"
            )));
        }
        let name = self.api_server_name.trim();
        Ok(ApiEndpoint::Server {
            url: url.trim_end_matches('/').to_owned(),
            tls_server_name: (!name.is_empty()).then(|| name.to_owned()),
        })
    }

    fn kubelet_trust(&self) -> Result<KubeletTrust> {
        let ca = self
            .kubelet_ca
            .as_deref()
            .map(str::trim)
            .filter(|c| !c.is_empty());
        if !self.runtime_endpoint.is_empty() {
            if ca.is_some() || self.kubelet_insecure {
                return Err(Error::usage_message(
                    "--kubelet-ca/--kubelet-insecure: the kubelet API is read only with --runtime-endpoint \"\"",
                ));
            }
            return Ok(KubeletTrust::NotUsed);
        }
        match (ca, self.kubelet_insecure) {
            (Some(ca), false) if ca.starts_with('/') && parent_dir(ca).is_some() => {
                Ok(KubeletTrust::Ca(ca.to_owned()))
            }
            (Some(ca), false) => Err(Error::usage_message(format!(
                "--kubelet-ca: {ca:?} is not an absolute file path"
            ))),
            (None, true) => Ok(KubeletTrust::Insecure),
            (Some(_), true) => Err(Error::usage_message(
                "--kubelet-ca and --kubelet-insecure exclude each other",
            )),
            (None, false) => Err(Error::usage_message(
                "--runtime-endpoint \"\": the agent reads the kubelet's /pods over https with the \
                 service-account token; pass --kubelet-ca FILE (the CA of the kubelets' serving \
                 certificates) or, knowingly, --kubelet-insecure",
            )),
        }
    }
}

/// What the manifests are checked against before anything is rendered or sent: the agent
/// binary they will run. A binary built with extra strategy crates (README, "A strategy of
/// your own") knows strategies and settings this program may not, so tools that render
/// for another binary ask it ([`BuiltIn`] is this program's own).
pub trait AgentChecks {
    /// The names of the strategies the agent has registered.
    fn strategies(&self) -> Result<Vec<String>>;
    /// Whether the agent accepts this `--config` file (a usage error saying why not).
    fn check_config(&self, yaml: &str) -> Result<()>;
}

/// The registry and config parser linked into this program.
#[derive(Clone, Copy, Debug, Default)]
pub struct BuiltIn;

impl AgentChecks for BuiltIn {
    fn strategies(&self) -> Result<Vec<String>> {
        Ok(ckpt_gc::names().into_iter().map(str::to_owned).collect())
    }

    fn check_config(&self, yaml: &str) -> Result<()> {
        crate::config::check_config_file(yaml)
    }
}

/// Rejects a strategy the agent does not know, naming the ones it does.
pub fn check_strategy(name: &str, known: &[String]) -> Result<()> {
    if known.iter().any(|k| k == name) {
        return Ok(());
    }
    Err(Error::usage_message(format!(
        "--gc-strategy: unknown strategy {name:?}; registered strategies: {}",
        known.join(", ")
    )))
}

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

/// What `render` prints: a header, then one YAML document per object. Each RBAC rule is
/// preceded by a comment saying why the agent needs it, and the DaemonSet's security
/// choices are explained where they are made.
pub fn to_yaml(objects: &[Manifest]) -> Result<String> {
    let mut out = String::from(
        "# pod-checkpointer: ServiceAccounts, RBAC, agent config, API kubeconfig and DaemonSet.\n\
         # Generated by `pod-checkpointer render` (do not edit; pass flags to change it).\n",
    );
    for (index, object) in objects.iter().enumerate() {
        if index > 0 {
            out.push_str("---\n");
        }
        match object {
            Manifest::ClusterRole(role) => {
                let bare = ClusterRole {
                    rules: None,
                    ..role.clone()
                };
                out.push_str(&role_yaml(&bare, role.rules.as_deref(), &object.describe())?);
            }
            Manifest::Role(role) => {
                let bare = Role {
                    rules: None,
                    ..role.clone()
                };
                out.push_str(&role_yaml(&bare, role.rules.as_deref(), &object.describe())?);
            }
            Manifest::DaemonSet(daemonset) => {
                let text = yaml(daemonset.as_ref(), &object.describe())?;
                out.push_str(&objects::explain_daemonset(
                    &text,
                    &objects::lock_dir_of(daemonset),
                ));
            }
            other => out.push_str(&yaml(other, &object.describe())?),
        }
    }
    Ok(out)
}

/// `rules:` with each rule's reason as a comment above it. k8s-openapi writes `rules`
/// last, so appending it to the object without rules keeps the field order.
/// A (Cluster)Role: the object without its rules, then the rules, each with why it is needed.
fn role_yaml<T: Serialize>(bare: &T, rules: Option<&[PolicyRule]>, what: &str) -> Result<String> {
    Ok(yaml(bare, what)? + &commented_rules(rules.unwrap_or_default(), what)?)
}

fn commented_rules(rules: &[PolicyRule], what: &str) -> Result<String> {
    let mut out = String::from("rules:\n");
    for rule in rules {
        let why = objects::why(rule).ok_or_else(|| {
            Error::usage_message(format!("{what}: no reason is recorded for the rule {rule:?}"))
        })?;
        out.push_str(&format!("# {why}\n"));
        out.push_str(&yaml(&[rule], what)?);
    }
    Ok(out)
}

fn yaml<T: Serialize>(value: &T, what: &str) -> Result<String> {
    serde_saphyr::to_string(value).map_err(|e| Error::runtime(format!("cannot write {what}"), e))
}

impl ManifestOptions {
    /// The agent's `--config` file: the long flag names without dashes.
    pub fn agent_config(&self) -> String {
        #[derive(Serialize)]
        #[serde(rename_all = "kebab-case")]
        struct AgentConfig<'a> {
            gc_strategy: &'a str,
            checkpoint_grace_period: &'a str,
            revisions: usize,
            handoff_timeout: &'a str,
            namespaces: &'a [String],
            checkpoint_dir: &'a str,
            manifests_dir: &'a str,
            lock_file: &'a str,
            runtime_endpoint: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            kubelet_ca: Option<&'a str>,
            #[serde(skip_serializing_if = "std::ops::Not::not")]
            kubelet_insecure: bool,
            metrics_addr: String,
            health_socket: String,
            // Written out so operators find where to turn on debug logs for both copies.
            log_level: &'a str,
        }
        let config = AgentConfig {
            gc_strategy: &self.gc_strategy,
            checkpoint_grace_period: &self.grace_period,
            revisions: self.revisions,
            handoff_timeout: &self.handoff_timeout,
            namespaces: &self.namespaces,
            checkpoint_dir: objects::CHECKPOINT_DIR,
            manifests_dir: &self.manifests_dir,
            lock_file: &self.lock_file,
            runtime_endpoint: &self.runtime_endpoint,
            kubelet_ca: match &self.kubelet {
                KubeletTrust::Ca(path) => Some(path),
                _ => None,
            },
            kubelet_insecure: self.kubelet == KubeletTrust::Insecure,
            metrics_addr: format!("127.0.0.1:{}", self.metrics_port),
            health_socket: objects::health_socket(),
            log_level: crate::config::DEFAULT_LOG_LEVEL,
        };
        let body = serde_saphyr::to_string(&config).unwrap_or_default();
        format!(
            "# pod-checkpointer run --config: the keys are its long flag names (see --help).\n\
             # NODE_NAME, POD_NAME, POD_NAMESPACE and HOST_IP come from the pod's environment.\n{body}"
        )
    }
}

/// `/run/containerd` of `/run/containerd/containerd.sock`; `None` for `/x.sock` (the root
/// dir is never mounted).
fn parent_dir(path: &str) -> Option<&str> {
    path.rsplit_once('/')
        .map(|(dir, _)| dir)
        .filter(|dir| !dir.is_empty())
}

#[cfg(test)]
mod tests;
