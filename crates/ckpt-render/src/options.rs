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
    /// Also run on the nodes with this label, KEY (any value) or KEY=VALUE (repeatable).
    /// Without --only-node-labels the agent runs on nodes with any of these or a
    /// control-plane label: node-role.kubernetes.io/control-plane,
    /// node-role.kubernetes.io/master, or node.kubernetes.io/controller=true (Typhoon)
    #[arg(long, value_name = "KEY[=VALUE]")]
    pub node_label: Vec<String>,
    /// Run only on the nodes with a --node-label, not on every control-plane node
    #[arg(long, requires = "node_label")]
    pub only_node_labels: bool,
    /// The agent's priority class; "" for none
    #[arg(long, value_name = "NAME", default_value = DEFAULT_PRIORITY_CLASS)]
    pub priority_class: String,
    /// A Secret in --namespace to pull the image with (repeatable). The static copy never
    /// pulls: it restarts from the image the node already has
    #[arg(long, value_name = "NAME")]
    pub image_pull_secret: Vec<String>,
    /// A memory limit for the agent's container, e.g. 256Mi [default: none]. An agent
    /// killed for memory during an outage takes the recovery with it, and the static copy
    /// inherits the limit; at least the request (32Mi)
    #[arg(long, value_name = "QUANTITY")]
    pub memory_limit: Option<String>,
    /// The log format of both copies
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Which log lines both copies write: a level (error, warn, info, debug, trace) or
    /// tracing directives, e.g. info,ckpt_watch=debug
    #[arg(long, value_name = "FILTER", default_value = DEFAULT_LOG_LEVEL)]
    pub log_level: String,
}

/// `--log-format`: the agent's own choices.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for a log pipeline.
    Json,
}

impl LogFormat {
    /// The name the flag and the config file use.
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

/// A node label the DaemonSet's pods must find: `value: None` means any value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeLabel {
    pub key: String,
    pub value: Option<String>,
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
            node_label: Vec::new(),
            only_node_labels: false,
            priority_class: DEFAULT_PRIORITY_CLASS.to_owned(),
            image_pull_secret: Vec::new(),
            memory_limit: None,
            log_format: LogFormat::Text,
            log_level: DEFAULT_LOG_LEVEL.to_owned(),
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
    /// The DaemonSet runs on nodes with any of these (ORed node-affinity terms).
    pub node_labels: Vec<NodeLabel>,
    /// `None`: no priority class.
    pub priority_class: Option<String>,
    /// Sorted, deduplicated.
    pub image_pull_secrets: Vec<String>,
    /// A Kubernetes quantity, at least [`MEMORY_REQUEST`].
    pub memory_limit: Option<String>,
    pub log_format: LogFormat,
    pub log_level: String,
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
        check_image(self.image.trim())?;
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
        let node_labels = self.node_labels()?;
        let priority_class = match self.priority_class.trim() {
            "" => None,
            name if ckpt_core::is_dns_subdomain(name) => Some(name.to_owned()),
            name => {
                return usage(format!(
                    "--priority-class: {name:?} is not a valid PriorityClass name"
                ));
            }
        };
        let mut image_pull_secrets: Vec<String> = self
            .image_pull_secret
            .iter()
            .map(|s| s.trim().to_owned())
            .collect();
        image_pull_secrets.sort();
        image_pull_secrets.dedup();
        if let Some(bad) = image_pull_secrets
            .iter()
            .find(|s| !ckpt_core::is_dns_subdomain(s))
        {
            return usage(format!("--image-pull-secret: {bad:?} is not a valid Secret name"));
        }
        let memory_limit = self.memory_limit.as_deref().map(check_memory_limit).transpose()?;
        let log_level = self.log_level.trim();
        if log_level.is_empty() {
            return usage(format!(
                "--log-level must not be empty (the default is {DEFAULT_LOG_LEVEL:?})"
            ));
        }
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
            node_labels,
            priority_class,
            image_pull_secrets,
            memory_limit,
            log_format: self.log_format,
            log_level: log_level.to_owned(),
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

    /// The node-affinity terms: `--node-label`s, after the control-plane labels unless
    /// `--only-node-labels`.
    fn node_labels(&self) -> Result<Vec<NodeLabel>> {
        let mut labels: Vec<NodeLabel> = if self.only_node_labels {
            Vec::new()
        } else {
            CONTROL_PLANE_LABELS
                .iter()
                .map(|(key, value)| NodeLabel {
                    key: (*key).to_owned(),
                    value: value.map(str::to_owned),
                })
                .collect()
        };
        for given in &self.node_label {
            let label = parse_node_label(given.trim())?;
            if !labels.contains(&label) {
                labels.push(label);
            }
        }
        if labels.is_empty() {
            // clap's `requires` sees the flag, not an empty value list.
            return Err(Error::usage_message(
                "--only-node-labels needs at least one --node-label KEY[=VALUE]",
            ));
        }
        Ok(labels)
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

/// `KEY` or `KEY=VALUE`, as `kubectl label` writes them: a key of an optional DNS
/// subdomain prefix and a name of at most 63 characters, a value of at most 63.
pub(crate) fn parse_node_label(given: &str) -> Result<NodeLabel> {
    let (key, value) = match given.split_once('=') {
        Some((key, value)) => (key, Some(value)),
        None => (given, None),
    };
    let name_ok = |name: &str| {
        name.len() <= 63
            && name.starts_with(|c: char| c.is_ascii_alphanumeric())
            && name.ends_with(|c: char| c.is_ascii_alphanumeric())
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    let key_ok = match key.split_once('/') {
        Some((prefix, name)) => ckpt_core::is_dns_subdomain(prefix) && name_ok(name),
        None => name_ok(key),
    };
    if !key_ok {
        return Err(Error::usage_message(format!(
            "--node-label: {key:?} is not a label key like node.kubernetes.io/controller (KEY or KEY=VALUE)"
        )));
    }
    if let Some(value) = value
        && !(value.is_empty() || name_ok(value))
    {
        return Err(Error::usage_message(format!(
            "--node-label: {value:?} is not a label value (at most 63 letters, digits, '-', '_' or '.')"
        )));
    }
    Ok(NodeLabel {
        key: key.to_owned(),
        value: value.map(str::to_owned),
    })
}

/// An image reference: not empty, no whitespace, and a digest, if any, in full
/// (`@sha256:` and 64 hex digits): a pinned image that cannot be pulled would fail every
/// node's agent at once.
pub(crate) fn check_image(image: &str) -> Result<()> {
    let usage = |why: &str| {
        Err(Error::usage_message(format!(
            "--image: {image:?} {why}, like ghcr.io/pod-checkpointer/pod-checkpointer:0.1.0 or …@sha256:<64 hex digits>"
        )))
    };
    if image.is_empty() || image.contains(char::is_whitespace) {
        return usage("is not an image reference");
    }
    if let Some((name, digest)) = image.split_once('@') {
        let hex = digest.strip_prefix("sha256:").unwrap_or("");
        let lowercase_hex = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c);
        if name.is_empty() || hex.len() != 64 || !hex.chars().all(lowercase_hex) {
            return usage("has no valid digest");
        }
    }
    Ok(())
}

/// A memory quantity (`256Mi`, `1Gi`, `300M`, bytes) of at least [`MEMORY_REQUEST`].
pub(crate) fn check_memory_limit(given: &str) -> Result<String> {
    let given = given.trim();
    match (memory_bytes(given), memory_bytes(MEMORY_REQUEST)) {
        (None, _) => Err(Error::usage_message(format!(
            "--memory-limit: {given:?} is not a memory quantity like 256Mi or 1Gi"
        ))),
        (Some(limit), Some(request)) if limit < request => Err(Error::usage_message(format!(
            "--memory-limit: {given} is below the container's request ({MEMORY_REQUEST}); the agent's RSS is about 12 MiB at idle (BENCHMARKS.md)"
        ))),
        _ => Ok(given.to_owned()),
    }
}

/// The bytes of a memory quantity in the forms operators write (no exponents, no
/// fractions); `None` for anything else.
fn memory_bytes(given: &str) -> Option<u64> {
    let digits = given.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit: u64 = match &given[digits.len()..] {
        "" => 1,
        "k" => 1000,
        "M" => 1000_u64.pow(2),
        "G" => 1000_u64.pow(3),
        "T" => 1000_u64.pow(4),
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => 0,
    };
    digits
        .parse::<u64>()
        .ok()
        .filter(|_| unit > 0 && !digits.is_empty())
        .and_then(|n| n.checked_mul(unit))
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
