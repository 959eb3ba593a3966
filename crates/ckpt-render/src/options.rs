//! From flags to checked options: [`ManifestArgs`] (the flags of `pod-checkpointer render`)
//! become [`ManifestOptions`] once they and the agent config they imply pass the agent's
//! own checks ([`AgentChecks`]).

use crate::defaults::*;
use crate::error::{Error, Result};
use crate::version::KubernetesVersion;

/// `--api-server in-cluster`: the `kubernetes` Service, as kube's in-cluster config finds it.
pub const IN_CLUSTER: &str = "in-cluster";

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
    /// the two exclude each other (docs/migration.md)
    #[arg(long, value_name = "PATH", default_value = DEFAULT_LOCK_FILE)]
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
    /// nodes/proxy instead of nodes/pods [render default: 1.37; deploy: read from the cluster]
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
            lock_file: DEFAULT_LOCK_FILE.to_owned(),
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
    /// Checks the flags the way the agent `agent` answers for will check its config,
    /// before anything is rendered or sent; `version` stands in when
    /// `--kubernetes-version` is not given.
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
        // settings, namespaces that leave out its own) never reaches a cluster. Its
        // namespace comes from the pod at run time; the check is told it.
        let checked = format!("{}pod-namespace: {}\n", options.agent_config(), options.namespace);
        agent.check_config(&checked).map_err(|e| {
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
/// binary they will run. A binary built with extra strategy crates (docs/development.md, "A strategy of
/// your own") knows strategies and settings this program may not, so tools that render
/// for another binary ask it. The agent's own library implements it with its registry and
/// config parser (`ckpt_bin::render::BuiltIn`): this crate does not link the agent.
pub trait AgentChecks {
    /// The names of the strategies the agent has registered.
    fn strategies(&self) -> Result<Vec<String>>;
    /// Whether the agent accepts this `--config` file (a usage error saying why not).
    fn check_config(&self, yaml: &str) -> Result<()>;
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

/// `/run/containerd` of `/run/containerd/containerd.sock`; `None` for `/x.sock` (the root
/// dir is never mounted).
pub(crate) fn parent_dir(path: &str) -> Option<&str> {
    path.rsplit_once('/')
        .map(|(dir, _)| dir)
        .filter(|dir| !dir.is_empty())
}
