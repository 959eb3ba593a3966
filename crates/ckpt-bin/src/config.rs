//! The command line (ARCHITECTURE.md, Command-line contract) and the YAML config file, merged with the precedence
//! flags > environment > file > defaults into `RunSettings` / `DiskSettings`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

// The defaults the install manifests share with `run` are the renderer's (its
// `defaults`), so a render without flags matches a run without them.
use ckpt_render::defaults::{
    CONFIG_API_VERSION, CONFIG_KIND, DEFAULT_LOCK_FILE, DEFAULT_LOG_LEVEL, DEFAULT_MANIFESTS_DIR,
    DEFAULT_RUNTIME_ENDPOINT,
};
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Deserialize;

use crate::duration::parse_duration;
use crate::error::{Error, Result};

/// `pod-checkpointer`: keeps a self-hosted Kubernetes control plane bootable.
#[derive(Debug, Parser)]
#[command(name = "pod-checkpointer", version, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
    /// What was mapped from the original's command line, for `run` to log.
    #[arg(skip)]
    pub(crate) original_notes: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run the agent: checkpoint, activate, deactivate and garbage-collect.
    Run(Box<RunArgs>),
    /// Show what is checkpointed, its state, and what the kubelet would run after a reboot.
    Inspect(InspectArgs),
    /// Remove every checkpoint safely (uninstall or migration to static pods).
    Drain(DrainArgs),
    /// List the registered garbage-collection strategies.
    Strategies,
    /// Check a `--config` file as `run` would read it (keys, strategy and its settings,
    /// durations, log level): exit 0, or 2 saying what is wrong.
    CheckConfig(CheckConfigArgs),
    /// Ask the agent of this pod whether it is ready or live (the pod's exec probes).
    Health(HealthArgs),
    /// Write the manifests that install pod-checkpointer (ServiceAccounts, RBAC, config,
    /// API kubeconfig, DaemonSet) as YAML.
    Render(Box<RenderArgs>),
}

/// `pod-checkpointer health`: exit 0 when the agent answers 200, 1 otherwise (its answer,
/// or why there is none, on stderr).
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("probe").required(true).args(["ready", "live"])))]
pub(crate) struct HealthArgs {
    /// Readiness: the holder after its first pass, or a healthy copy waiting on the lock
    #[arg(long)]
    pub(crate) ready: bool,
    /// Liveness: holding the lock and passing, or waiting on it
    #[arg(long)]
    pub(crate) live: bool,
    /// The agent's health socket (its --health-socket)
    #[arg(long, value_name = "PATH")]
    pub(crate) health_socket: Option<PathBuf>,
    /// The agent's config file, for its `health-socket:`
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
}

/// `pod-checkpointer check-config`.
#[derive(Debug, Args)]
pub(crate) struct CheckConfigArgs {
    /// The config file, or "-" for stdin
    #[arg(value_name = "FILE|-")]
    pub(crate) file: PathBuf,
}

/// `pod-checkpointer render`.
#[derive(Debug, Args)]
pub(crate) struct RenderArgs {
    #[command(flatten)]
    pub(crate) manifest: ckpt_render::ManifestArgs,
    /// Write the YAML to FILE, or "-" for stdout
    #[arg(short = 'o', long = "output", value_name = "FILE|-", default_value = "-")]
    pub(crate) output: String,
}

/// Paths shared by every subcommand that touches the disk.
#[derive(Debug, Args, Clone, Default)]
pub(crate) struct DiskArgs {
    /// The kubelet's static pod directory (active checkpoints) [default: /etc/kubernetes/manifests]
    #[arg(long, value_name = "DIR")]
    pub(crate) manifests_dir: Option<PathBuf>,
    /// Where inactive checkpoints, their secrets and configmaps live [default: /etc/kubernetes]
    #[arg(long, value_name = "DIR")]
    pub(crate) checkpoint_dir: Option<PathBuf>,
    /// The lock shared by the DaemonSet copy and the static copy, in a directory only root can write [default: /run/pod-checkpointer/pod-checkpointer.lock]
    #[arg(long, value_name = "PATH")]
    pub(crate) lock_file: Option<PathBuf>,
    /// YAML config file with the same keys as the long flags (flags > env > file > defaults)
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// This node's name
    #[arg(long, env = "NODE_NAME")]
    pub(crate) node_name: Option<String>,
    /// This pod's name (the static copy's is `<name>-<node>`)
    #[arg(long, env = "POD_NAME")]
    pub(crate) pod_name: Option<String>,
    /// This pod's namespace
    #[arg(long, env = "POD_NAMESPACE")]
    pub(crate) pod_namespace: Option<String>,
    /// Kubeconfig for the API server [default: in-cluster, else /etc/kubernetes/kubeconfig]
    #[arg(long, env = "KUBECONFIG", value_name = "PATH")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// The kubelet API [default: https://$HOST_IP:10250, HOST_IP default 127.0.0.1]
    #[arg(long, value_name = "URL")]
    pub(crate) kubelet_url: Option<String>,
    /// A read-only kubelet API to fall back to [default: none]
    #[arg(long, value_name = "URL")]
    pub(crate) kubelet_readonly_url: Option<String>,
    /// CRI endpoint; "" turns the CRI off (then the kubelet's /pods says what runs)
    /// [default: unix:///run/containerd/containerd.sock]
    #[arg(long, value_name = "URL")]
    pub(crate) runtime_endpoint: Option<String>,
    /// The CA bundle that signed the kubelet's serving certificate: verify it before the
    /// service-account token is sent
    #[arg(long, value_name = "FILE")]
    pub(crate) kubelet_ca: Option<PathBuf>,
    /// Do not verify the kubelet's serving certificate (the token goes to whatever answers)
    #[arg(long, conflicts_with = "kubelet_ca")]
    pub(crate) kubelet_insecure: bool,
    /// GC strategy (see `pod-checkpointer strategies`) [default: grace-period]
    #[arg(long, value_name = "NAME")]
    pub(crate) gc_strategy: Option<String>,
    /// How long a parent must be gone before its checkpoint is removed, e.g. 2s, 5m [default: 1m]
    #[arg(long, value_name = "DURATION")]
    pub(crate) checkpoint_grace_period: Option<String>,
    /// Checkpoints kept per DaemonSet on this node: the newest and known-good ones, which an
    /// activation prefers; 1 keeps only the newest, as the original [default: 2]
    #[arg(long, value_name = "N")]
    pub(crate) revisions: Option<usize>,
    /// How long a parent with unproven content has to become Ready once the known-good
    /// checkpoint stepped aside for it, before that checkpoint returns [default: 2m]
    #[arg(long, value_name = "DURATION")]
    pub(crate) handoff_timeout: Option<String>,
    /// Namespaces whose pods may be checkpointed [default: the pod's own namespace]
    #[arg(long, value_name = "NS[,NS…]", value_delimiter = ',')]
    pub(crate) namespaces: Option<Vec<String>>,
    /// Address for /healthz, /readyz and /metrics; "" turns it off [default: 127.0.0.1:10266]
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics_addr: Option<String>,
    /// Where the active copy also serves /metrics, /healthz and /readyz for Prometheus,
    /// e.g. the node's IP ($(HOST_IP):10267 in a pod spec); only while it holds the lock,
    /// so a scrape always reaches the active copy; "" turns it off [default: off]
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics_listen: Option<String>,
    /// A unix socket answering /healthz and /readyz for this process alone (what
    /// `pod-checkpointer health` asks); "" turns it off [default: off]
    #[arg(long, value_name = "PATH")]
    pub(crate) health_socket: Option<PathBuf>,
    /// Log format [default: text]
    #[arg(long, value_enum)]
    pub(crate) log_format: Option<LogFormat>,
    /// Which log lines to write: a level (error, warn, info, debug, trace) or tracing
    /// directives, e.g. `info,ckpt_watch=debug` [default: info]
    #[arg(long, env = "RUST_LOG", value_name = "FILTER")]
    pub(crate) log_level: Option<String>,
    /// The service account (in the pod's namespace) whose tokens are kept for the static
    /// copy; this copy mints them [default: pod-checkpointer-static]
    #[arg(long, value_name = "NAME")]
    pub(crate) static_service_account: Option<String>,
    /// How long the lock holder may stay rejected by the API server (401) before it hands
    /// the lock to the other copy, e.g. 1m [default: 1m]
    #[arg(long, value_name = "DURATION")]
    pub(crate) unauthorized_handover: Option<String>,
    #[command(flatten)]
    pub(crate) disk: DiskArgs,
}

#[derive(Debug, Args)]
pub(crate) struct InspectArgs {
    /// Output format
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    pub(crate) output: OutputFormat,
    #[command(flatten)]
    pub(crate) disk: DiskArgs,
}

#[derive(Debug, Args)]
pub(crate) struct DrainArgs {
    /// Drain even while a running agent holds the lock
    #[arg(long)]
    pub(crate) force: bool,
    /// Show what would be removed, in order, and change nothing (takes no lock)
    #[arg(long, conflicts_with = "force")]
    pub(crate) dry_run: bool,
    #[command(flatten)]
    pub(crate) disk: DiskArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OutputFormat {
    Table,
    Json,
}

/// The YAML config file: the long flag names without dashes; strategy settings in `gc:`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) struct FileConfig {
    /// [`ckpt_render::CONFIG_API_VERSION`]; a file without it (and `kind`) is read as that
    /// version, with a warning.
    #[serde(rename = "apiVersion")]
    api_version: Option<String>,
    kind: Option<String>,
    /// A non-empty file without `apiVersion` and `kind`: the warning to give.
    #[serde(skip)]
    unversioned: Option<String>,
    node_name: Option<String>,
    pod_name: Option<String>,
    pod_namespace: Option<String>,
    kubeconfig: Option<PathBuf>,
    kubelet_url: Option<String>,
    kubelet_readonly_url: Option<String>,
    runtime_endpoint: Option<String>,
    kubelet_ca: Option<PathBuf>,
    kubelet_insecure: Option<bool>,
    health_socket: Option<PathBuf>,
    manifests_dir: Option<PathBuf>,
    checkpoint_dir: Option<PathBuf>,
    lock_file: Option<PathBuf>,
    gc_strategy: Option<String>,
    checkpoint_grace_period: Option<String>,
    revisions: Option<usize>,
    handoff_timeout: Option<String>,
    namespaces: Option<Namespaces>,
    metrics_addr: Option<String>,
    metrics_listen: Option<String>,
    log_format: Option<LogFormat>,
    log_level: Option<String>,
    static_service_account: Option<String>,
    unauthorized_handover: Option<String>,
    gc: Option<BTreeMap<String, serde_json::Value>>,
}

impl FileConfig {
    /// `health-socket:`, what `pod-checkpointer health` asks when not told.
    pub(crate) fn health_socket(&self) -> Option<PathBuf> {
        self.health_socket.clone()
    }

    /// `revisions:`, what `inspect` reports the revisions by (0 counts as 1).
    pub(crate) fn revision_settings(&self) -> ckpt_core::revisions::RevisionSettings {
        ckpt_core::revisions::RevisionSettings {
            keep: self
                .revisions
                .unwrap_or(ckpt_core::revisions::DEFAULT_KEEP)
                .max(1),
            ..Default::default()
        }
    }
}

/// `namespaces: [a, b]` or `namespaces: "a,b"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Namespaces {
    List(Vec<String>),
    Text(String),
}

impl Namespaces {
    fn into_vec(self) -> Vec<String> {
        match self {
            Namespaces::List(v) => v,
            Namespaces::Text(t) => t
                .split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect(),
        }
    }
}

/// Checks a YAML config file the way `run` does: the keys, the strategy and its `gc:`
/// settings, durations, namespaces. The identity (node, pod, namespace) may come from the
/// environment at run time, so placeholders stand in for it when the file lacks it.
/// Stricter than `run` in one thing: a file naming the agent's namespace (`pod-namespace`)
/// must allow it in `namespaces`, or the agent never checkpoints itself and nothing
/// restarts it after a reboot (`run` only warns: refusing would leave the node with no
/// agent at all).
///
/// `Ok(Some(warning))`: accepted, but without `apiVersion` and `kind`.
pub fn check_config_file(yaml: &str) -> Result<Option<String>> {
    let file = parse_file_config(yaml, "config")?;
    let warning = file.unversioned_warning().map(str::to_owned);
    let own_namespace = file.pod_namespace.clone();
    let identity = Some("placeholder".to_owned());
    let args = RunArgs {
        node_name: file.node_name.clone().or(identity.clone()),
        pod_name: file.pod_name.clone().or(identity.clone()),
        pod_namespace: file.pod_namespace.clone().or(identity),
        kubeconfig: None,
        kubelet_url: None,
        kubelet_readonly_url: None,
        runtime_endpoint: None,
        kubelet_ca: None,
        kubelet_insecure: false,
        gc_strategy: None,
        checkpoint_grace_period: None,
        revisions: None,
        handoff_timeout: None,
        namespaces: None,
        metrics_addr: None,
        metrics_listen: None,
        health_socket: None,
        log_format: None,
        log_level: None,
        static_service_account: None,
        unauthorized_handover: None,
        disk: DiskArgs::default(),
    };
    let settings = RunSettings::resolve(
        args,
        file,
        &Environment {
            host_ip: None,
            in_cluster: true,
            service_account_token: true,
        },
    )?;
    let allowed = ckpt_core::NamespaceAllowList::new(settings.namespaces.iter().cloned());
    match own_namespace {
        Some(own) if !allowed.allows(&own) => Err(Error::usage_message(format!(
            "--namespaces: the agent's own namespace {own} is not among {:?}, so its pod is never \
             checkpointed and after a reboot nothing restarts it: add {own}",
            settings.namespaces
        ))),
        _ => Ok(warning),
    }
}

fn parse_file_config(text: &str, origin: &str) -> Result<FileConfig> {
    if text.trim().is_empty() {
        return Ok(FileConfig::default());
    }
    let mut file: FileConfig =
        serde_saphyr::from_str(text).map_err(|e| Error::usage(format!("--config: {origin}"), e))?;
    let expected = [
        ("apiVersion", &file.api_version, CONFIG_API_VERSION),
        ("kind", &file.kind, CONFIG_KIND),
    ];
    for (key, given, known) in expected {
        if let Some(given) = given.as_deref()
            && given != known
        {
            return Err(Error::usage_message(format!(
                "--config: {origin}: {key} {given:?} is not one this agent reads ({key}: {known}); \
                 an older agent reading a newer file, or a typo"
            )));
        }
    }
    match (&file.api_version, &file.kind) {
        (None, None) => {
            file.unversioned = Some(format!(
                "--config: {origin}: no apiVersion and kind: read as {CONFIG_API_VERSION} {CONFIG_KIND}; \
                 add `apiVersion: {CONFIG_API_VERSION}` and `kind: {CONFIG_KIND}` (render writes them)"
            ));
        }
        (Some(_), None) | (None, Some(_)) => {
            return Err(Error::usage_message(format!(
                "--config: {origin}: apiVersion and kind go together: `apiVersion: {CONFIG_API_VERSION}` and `kind: {CONFIG_KIND}`"
            )));
        }
        (Some(_), Some(_)) => {}
    }
    Ok(file)
}

impl FileConfig {
    /// The warning for a file without `apiVersion` and `kind`, read as the current version.
    pub(crate) fn unversioned_warning(&self) -> Option<&str> {
        self.unversioned.as_deref()
    }
}

/// Reads the config file (empty when none is given).
pub(crate) fn read_file_config(path: Option<&Path>) -> Result<FileConfig> {
    let Some(path) = path else {
        return Ok(FileConfig::default());
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::usage(format!("--config: cannot read {}", path.display()), e))?;
    parse_file_config(&text, &path.display().to_string())
}

pub(crate) const DEFAULT_CHECKPOINT_DIR: &str = "/etc/kubernetes";
/// `ckpt_render::DEFAULT_METRICS_PORT` on loopback.
pub(crate) const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:10266";
pub(crate) const DEFAULT_KUBECONFIG: &str = "/etc/kubernetes/kubeconfig";
pub(crate) const DEFAULT_STATIC_SERVICE_ACCOUNT: &str = "pod-checkpointer-static";
/// Long enough for a refreshed token file to be re-read (kube clients re-read it every
/// minute) and for a restarting API server's authenticator; short enough that a node
/// returns to a working copy in about a minute.
pub(crate) const DEFAULT_UNAUTHORIZED_HANDOVER: Duration = Duration::from_secs(60);
/// The service-account token the kubelet API is called with, when running in a pod.
pub(crate) const SERVICE_ACCOUNT_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// Where checkpoints live on disk, and the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DiskSettings {
    pub(crate) manifests_dir: PathBuf,
    pub(crate) checkpoint_dir: PathBuf,
    pub(crate) lock_file: PathBuf,
}

impl DiskSettings {
    pub(crate) fn resolve(args: &DiskArgs, file: &FileConfig) -> Self {
        let pick = |flag: &Option<PathBuf>, file: &Option<PathBuf>, default: &str| {
            flag.clone()
                .or_else(|| file.clone())
                .unwrap_or_else(|| PathBuf::from(default))
        };
        Self {
            manifests_dir: pick(&args.manifests_dir, &file.manifests_dir, DEFAULT_MANIFESTS_DIR),
            checkpoint_dir: pick(&args.checkpoint_dir, &file.checkpoint_dir, DEFAULT_CHECKPOINT_DIR),
            lock_file: pick(&args.lock_file, &file.lock_file, DEFAULT_LOCK_FILE),
        }
    }

    pub(crate) fn layout(&self) -> ckpt_store::Layout {
        ckpt_store::Layout::new(&self.checkpoint_dir, &self.manifests_dir)
    }
}

/// How to reach the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KubeconfigSource {
    /// `--kubeconfig` / `KUBECONFIG` / the file's `kubeconfig`: must be readable (exit 2).
    File(PathBuf),
    /// Nothing given, KUBERNETES_SERVICE_HOST set: the pod's service account.
    InCluster,
    /// Nothing given, not in a cluster: `/etc/kubernetes/kubeconfig`.
    Default(PathBuf),
}

impl KubeconfigSource {
    /// Whether the operator named the kubeconfig. Only then is an unreadable one a usage
    /// error: otherwise the agent may be the static copy after a reboot, which has no
    /// service-account token and no service environment, and must still start the other
    /// checkpoints without an API server.
    pub(crate) fn is_explicit(&self) -> bool {
        matches!(self, KubeconfigSource::File(_))
    }
}

/// Everything `run` needs, validated.
#[derive(Debug, Clone)]
pub(crate) struct RunSettings {
    pub(crate) node_name: String,
    pub(crate) pod_name: String,
    pub(crate) pod_namespace: String,
    pub(crate) kubeconfig: KubeconfigSource,
    pub(crate) kubelet_url: String,
    pub(crate) kubelet_readonly_url: Option<String>,
    pub(crate) runtime_endpoint: Option<String>,
    /// How the kubelet's certificate is trusted (used only with the CRI off).
    pub(crate) kubelet_trust: KubeletTrust,
    pub(crate) gc_strategy: String,
    pub(crate) grace_period: Duration,
    pub(crate) revisions: ckpt_core::revisions::RevisionSettings,
    pub(crate) gc_section: serde_json::Value,
    pub(crate) namespaces: Vec<String>,
    pub(crate) metrics_addr: Option<String>,
    /// `--metrics-listen`: served by the lock holder only.
    pub(crate) metrics_listen: Option<std::net::SocketAddr>,
    pub(crate) health_socket: Option<PathBuf>,
    pub(crate) log_format: LogFormat,
    /// The log filter: `--log-level`, `RUST_LOG`, `log-level:` in the file, or `info`.
    pub(crate) log_level: String,
    pub(crate) static_service_account: String,
    pub(crate) unauthorized_handover: Duration,
    pub(crate) disk: DiskSettings,
    /// Said once logging runs: a `--config` file without `apiVersion` and `kind`.
    pub(crate) config_warning: Option<String>,
}

/// How the agent trusts the kubelet's serving certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KubeletTrust {
    /// `--kubelet-ca`: verified against this bundle.
    Ca(PathBuf),
    /// `--kubelet-insecure`, or nothing to protect: plain http, no token, or the kubelet
    /// API not used.
    Unverified,
}

/// What the process environment says (injected, so tests need not mutate it).
pub(crate) struct Environment {
    pub(crate) host_ip: Option<String>,
    pub(crate) in_cluster: bool,
    /// The pod's service-account token exists: it is what the kubelet API is called with.
    pub(crate) service_account_token: bool,
}

impl Environment {
    pub(crate) fn from_process() -> Self {
        Self {
            host_ip: std::env::var("HOST_IP").ok().filter(|v| !v.is_empty()),
            in_cluster: std::env::var_os("KUBERNETES_SERVICE_HOST").is_some(),
            service_account_token: Path::new(SERVICE_ACCOUNT_TOKEN).exists(),
        }
    }
}

impl RunSettings {
    /// Merges flags (clap already applied the environment) over the file over defaults,
    /// then checks each concern in turn; the first usage error names its flag.
    pub(crate) fn resolve(args: RunArgs, file: FileConfig, env: &Environment) -> Result<Self> {
        let disk = DiskSettings::resolve(&args.disk, &file);
        let config_warning = file.unversioned_warning().map(str::to_owned);
        let given = file.under(args);
        let (node_name, pod_name, pod_namespace) = given.identity()?;
        let kubeconfig = given.kubeconfig_source(env);
        let (kubelet_url, kubelet_readonly_url) = given.kubelet_urls(env)?;
        let runtime_endpoint = given.runtime_endpoint()?;
        let kubelet_trust = kubelet_trust(
            given.kubelet_ca.clone().filter(|p| !p.as_os_str().is_empty()),
            given.kubelet_insecure.unwrap_or(false),
            runtime_endpoint.is_none(),
            &kubelet_url,
            env.service_account_token,
        )?;
        let grace_period = given.grace_period()?;
        let revisions = given.revisions()?;
        let (gc_strategy, gc_section) = given.gc(grace_period)?;
        let namespaces = given.namespaces(&pod_namespace)?;
        let (metrics_addr, metrics_listen, health_socket) = given.endpoints()?;
        let (static_service_account, unauthorized_handover) = given.static_copy()?;
        let log_level = given.log_level()?;
        Ok(Self {
            node_name,
            pod_name,
            pod_namespace,
            kubeconfig,
            kubelet_url,
            kubelet_readonly_url,
            runtime_endpoint,
            kubelet_trust,
            gc_strategy,
            grace_period,
            revisions,
            gc_section,
            namespaces,
            metrics_addr,
            metrics_listen,
            health_socket,
            log_format: given.log_format.unwrap_or(LogFormat::Text),
            log_level,
            static_service_account,
            unauthorized_handover,
            disk,
            config_warning,
        })
    }
}

/// `run`'s settings from the flags over the file ([`FileConfig::under`]), one concern a
/// method, in the order [`RunSettings::resolve`] checks them.
impl FileConfig {
    /// This file under `args`: a flag given wins over the file's key.
    fn under(self, args: RunArgs) -> FileConfig {
        FileConfig {
            api_version: self.api_version,
            kind: self.kind,
            unversioned: self.unversioned,
            node_name: args.node_name.or(self.node_name),
            pod_name: args.pod_name.or(self.pod_name),
            pod_namespace: args.pod_namespace.or(self.pod_namespace),
            kubeconfig: args.kubeconfig.or(self.kubeconfig),
            kubelet_url: args.kubelet_url.or(self.kubelet_url),
            kubelet_readonly_url: args.kubelet_readonly_url.or(self.kubelet_readonly_url),
            runtime_endpoint: args.runtime_endpoint.or(self.runtime_endpoint),
            kubelet_ca: args.kubelet_ca.or(self.kubelet_ca),
            kubelet_insecure: Some(args.kubelet_insecure || self.kubelet_insecure.unwrap_or(false)),
            health_socket: args.health_socket.or(self.health_socket),
            manifests_dir: args.disk.manifests_dir.or(self.manifests_dir),
            checkpoint_dir: args.disk.checkpoint_dir.or(self.checkpoint_dir),
            lock_file: args.disk.lock_file.or(self.lock_file),
            gc_strategy: args.gc_strategy.or(self.gc_strategy),
            checkpoint_grace_period: args.checkpoint_grace_period.or(self.checkpoint_grace_period),
            revisions: args.revisions.or(self.revisions),
            handoff_timeout: args.handoff_timeout.or(self.handoff_timeout),
            namespaces: args.namespaces.map(Namespaces::List).or(self.namespaces),
            metrics_addr: args.metrics_addr.or(self.metrics_addr),
            metrics_listen: args.metrics_listen.or(self.metrics_listen),
            log_format: args.log_format.or(self.log_format),
            log_level: args.log_level.or(self.log_level),
            static_service_account: args.static_service_account.or(self.static_service_account),
            unauthorized_handover: args.unauthorized_handover.or(self.unauthorized_handover),
            gc: self.gc,
        }
    }

    /// Node, pod and namespace: required, from a flag, its variable or the file.
    fn identity(&self) -> Result<(String, String, String)> {
        let required = |value: &Option<String>, name: &str, var: &str| {
            value.clone().filter(|v| !v.is_empty()).ok_or_else(|| {
                Error::usage_message(format!(
                    "--{name} is required (or set {var}, or `{name}:` in --config)"
                ))
            })
        };
        Ok((
            required(&self.node_name, "node-name", "NODE_NAME")?,
            required(&self.pod_name, "pod-name", "POD_NAME")?,
            required(&self.pod_namespace, "pod-namespace", "POD_NAMESPACE")?,
        ))
    }

    fn kubeconfig_source(&self, env: &Environment) -> KubeconfigSource {
        match self.kubeconfig.clone().filter(|p| !p.as_os_str().is_empty()) {
            Some(path) => KubeconfigSource::File(path),
            None if env.in_cluster => KubeconfigSource::InCluster,
            None => KubeconfigSource::Default(PathBuf::from(DEFAULT_KUBECONFIG)),
        }
    }

    /// The kubelet API, and the read-only one to fall back to.
    fn kubelet_urls(&self, env: &Environment) -> Result<(String, Option<String>)> {
        let kubelet_url = self
            .kubelet_url
            .clone()
            .unwrap_or_else(|| format!("https://{}:10250", env.host_ip.as_deref().unwrap_or("127.0.0.1")));
        check_url("--kubelet-url", &kubelet_url)?;
        let readonly_url = self.kubelet_readonly_url.clone().filter(|u| !u.is_empty());
        if let Some(url) = &readonly_url {
            check_url("--kubelet-readonly-url", url)?;
        }
        Ok((kubelet_url, readonly_url))
    }

    /// The CRI socket; `None` turns the CRI off.
    fn runtime_endpoint(&self) -> Result<Option<String>> {
        let endpoint = self
            .runtime_endpoint
            .clone()
            .unwrap_or_else(|| DEFAULT_RUNTIME_ENDPOINT.to_owned());
        if endpoint.is_empty() {
            return Ok(None);
        }
        let path = endpoint.strip_prefix("unix://").unwrap_or(&endpoint);
        if !path.starts_with('/') {
            return Err(Error::usage_message(format!(
                "--runtime-endpoint: {endpoint:?} is not a unix socket (use unix:///path/to.sock, or \"\" to turn the CRI off)"
            )));
        }
        Ok(Some(endpoint))
    }

    fn grace_period(&self) -> Result<Duration> {
        match &self.checkpoint_grace_period {
            Some(text) => parse_duration(text).map_err(|e| Error::usage("--checkpoint-grace-period", e)),
            None => Ok(ckpt_gc::DEFAULT_GRACE_PERIOD),
        }
    }

    /// The strategy and its `gc:` settings, checked by building it before any lock or
    /// client, so a typo is a usage error (exit 2), not a crash loop.
    fn gc(&self, grace_period: Duration) -> Result<(String, serde_json::Value)> {
        let strategy = self
            .gc_strategy
            .clone()
            .unwrap_or_else(|| ckpt_gc::DEFAULT_STRATEGY.to_owned());
        let section = match &self.gc {
            Some(map) => serde_json::Value::Object(map.clone().into_iter().collect()),
            None => serde_json::Value::Null,
        };
        ckpt_gc::build(
            &strategy,
            &ckpt_gc::GcConfig::new(grace_period).with_gc_section(section.clone()),
        )
        .map_err(|e| Error::usage("--gc-strategy", e))?;
        Ok((strategy, section))
    }

    fn revisions(&self) -> Result<ckpt_core::revisions::RevisionSettings> {
        let keep = self.revisions.unwrap_or(ckpt_core::revisions::DEFAULT_KEEP);
        if keep == 0 {
            return Err(Error::usage(
                "--revisions",
                "0 would keep no checkpoint: 1 keeps only the newest",
            ));
        }
        let handoff_timeout = match &self.handoff_timeout {
            Some(text) => parse_duration(text).map_err(|e| Error::usage("--handoff-timeout", e))?,
            None => ckpt_core::revisions::DEFAULT_HANDOFF_TIMEOUT,
        };
        Ok(ckpt_core::revisions::RevisionSettings {
            keep,
            handoff_timeout,
        })
    }

    /// Sorted, without duplicates; the pod's own namespace when none is given.
    fn namespaces(&self, pod_namespace: &str) -> Result<Vec<String>> {
        let given = self
            .namespaces
            .clone()
            .map(Namespaces::into_vec)
            .unwrap_or_default();
        let mut namespaces: Vec<String> = given
            .into_iter()
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .collect();
        if namespaces.is_empty() {
            namespaces.push(pod_namespace.to_owned());
        }
        if let Some(bad) = namespaces.iter().find(|ns| !ckpt_core::is_dns_label(ns)) {
            return Err(Error::usage_message(format!(
                "--namespaces: {bad:?} is not a valid namespace name"
            )));
        }
        namespaces.sort();
        namespaces.dedup();
        Ok(namespaces)
    }

    /// `--metrics-addr`, `--metrics-listen` and `--health-socket`; "" turns each off.
    fn endpoints(&self) -> Result<(Option<String>, Option<std::net::SocketAddr>, Option<PathBuf>)> {
        let metrics_addr = self
            .metrics_addr
            .clone()
            .unwrap_or_else(|| DEFAULT_METRICS_ADDR.to_owned());
        let metrics_addr = (!metrics_addr.is_empty()).then_some(metrics_addr);
        if let Some(addr) = &metrics_addr
            && addr.parse::<std::net::SocketAddr>().is_err()
        {
            return Err(Error::usage_message(format!(
                "--metrics-addr: {addr:?} is not an address like {DEFAULT_METRICS_ADDR}"
            )));
        }
        let metrics_listen = match self.metrics_listen.as_deref() {
            Some(addr) if !addr.is_empty() => Some(addr.parse::<std::net::SocketAddr>().map_err(|_| {
                Error::usage_message(format!(
                    "--metrics-listen: {addr:?} is not an address like 10.0.0.5:10267 (in a pod spec, $(HOST_IP):10267)"
                ))
            })?),
            _ => None,
        };
        let health_socket = self.health_socket.clone().filter(|p| !p.as_os_str().is_empty());
        if let Some(path) = &health_socket
            && (!path.is_absolute() || path.parent().is_none_or(|p| p.as_os_str().is_empty()))
        {
            return Err(Error::usage_message(format!(
                "--health-socket: {} is not an absolute path",
                path.display()
            )));
        }
        Ok((metrics_addr, metrics_listen, health_socket))
    }

    /// The account whose tokens are kept for the static copy, and how long a holder may
    /// stay unauthorized before it hands the lock over.
    fn static_copy(&self) -> Result<(String, Duration)> {
        let account = self
            .static_service_account
            .clone()
            .unwrap_or_else(|| DEFAULT_STATIC_SERVICE_ACCOUNT.to_owned());
        if !ckpt_core::is_dns_subdomain(&account) {
            return Err(Error::usage_message(format!(
                "--static-service-account: {account:?} is not a valid service account name"
            )));
        }
        let handover = match &self.unauthorized_handover {
            Some(text) => parse_duration(text).map_err(|e| Error::usage("--unauthorized-handover", e))?,
            None => DEFAULT_UNAUTHORIZED_HANDOVER,
        };
        Ok((account, handover))
    }

    /// The log filter: `--log-level`, `RUST_LOG`, `log-level:` in the file, or `info`.
    fn log_level(&self) -> Result<String> {
        let level = self
            .log_level
            .clone()
            .filter(|v| !v.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_LOG_LEVEL.to_owned());
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&level) {
            return Err(Error::usage_message(format!(
                "--log-level (or RUST_LOG, or `log-level:` in --config): {level:?} is not a log filter: {e}"
            )));
        }
        Ok(level)
    }
}

/// `--kubelet-ca`/`--kubelet-insecure`: the token is never sent to an unverified kubelet
/// unless the operator said so. Only matters when the kubelet API is read (CRI off) over
/// https with a token.
fn kubelet_trust(
    ca: Option<PathBuf>,
    insecure: bool,
    kubelet_used: bool,
    url: &str,
    token: bool,
) -> Result<KubeletTrust> {
    match (ca, insecure) {
        (Some(_), true) => Err(Error::usage_message(
            "--kubelet-ca and --kubelet-insecure exclude each other",
        )),
        (Some(ca), false) => Ok(KubeletTrust::Ca(ca)),
        (None, true) => Ok(KubeletTrust::Unverified),
        (None, false) if kubelet_used && token && url.starts_with("https://") => {
            Err(Error::usage_message(format!(
                "--kubelet-ca: the kubelet API {url} is read over https with the service-account \
                 token (--runtime-endpoint \"\"); pass --kubelet-ca FILE to verify the kubelet's \
                 serving certificate, or --kubelet-insecure to send the token unverified"
            )))
        }
        (None, false) => Ok(KubeletTrust::Unverified),
    }
}

fn check_url(flag: &str, url: &str) -> Result<()> {
    let ok = (url.starts_with("http://") || url.starts_with("https://")) && url.len() > "https://".len();
    if ok {
        Ok(())
    } else {
        Err(Error::usage_message(format!(
            "{flag}: {url:?} is not an http:// or https:// URL"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(argv: &[&str], yaml: &str, env: Environment) -> Result<RunSettings> {
        let cli = Cli::try_parse_from(
            std::iter::once("pod-checkpointer")
                .chain(std::iter::once("run"))
                .chain(argv.iter().copied()),
        )
        .map_err(|e| Error::usage_message(e.to_string()))?;
        let Command::Run(args) = cli.command else {
            unreachable!("run")
        };
        let file = if yaml.is_empty() {
            FileConfig::default()
        } else {
            serde_saphyr::from_str(yaml).map_err(|e| Error::usage_message(e.to_string()))?
        };
        RunSettings::resolve(*args, file, &env)
    }

    fn no_env() -> Environment {
        Environment {
            host_ip: None,
            in_cluster: false,
            service_account_token: false,
        }
    }

    const IDS: [&str; 6] = [
        "--node-name",
        "n1",
        "--pod-name",
        "pc-1",
        "--pod-namespace",
        "kube-system",
    ];

    /// The port the install manifests put in the agent's config is the one `run` uses
    /// without one.
    #[test]
    fn the_default_metrics_address_is_on_the_renderers_port() {
        assert_eq!(
            DEFAULT_METRICS_ADDR,
            format!("127.0.0.1:{}", ckpt_render::DEFAULT_METRICS_PORT)
        );
    }

    #[test]
    fn defaults() {
        let s = resolve(&IDS, "", no_env()).expect("ok");
        assert_eq!(
            s.kubeconfig,
            KubeconfigSource::Default(PathBuf::from("/etc/kubernetes/kubeconfig"))
        );
        assert_eq!(s.kubelet_url, "https://127.0.0.1:10250");
        assert_eq!(s.runtime_endpoint.as_deref(), Some(DEFAULT_RUNTIME_ENDPOINT));
        assert_eq!(s.gc_strategy, "grace-period");
        assert_eq!(s.grace_period, Duration::from_secs(60));
        assert_eq!(s.namespaces, vec!["kube-system"]);
        assert_eq!(s.metrics_addr.as_deref(), Some(DEFAULT_METRICS_ADDR));
        assert_eq!(s.disk.lock_file, PathBuf::from(DEFAULT_LOCK_FILE));
        assert_eq!(s.disk.manifests_dir, PathBuf::from(DEFAULT_MANIFESTS_DIR));
        let s = resolve(
            &IDS,
            "",
            Environment {
                host_ip: Some("10.0.0.5".into()),
                in_cluster: true,
                service_account_token: true,
            },
        )
        .expect("ok");
        assert_eq!(s.kubelet_url, "https://10.0.0.5:10250");
        assert_eq!(s.kubeconfig, KubeconfigSource::InCluster);
    }

    #[test]
    fn flags_win_over_the_file() {
        let yaml = "gc-strategy: immediate\ncheckpoint-grace-period: 5m\nnamespaces: [kube-system, cni]\nruntime-endpoint: \"\"\nmetrics-addr: \"\"\ncheckpoint-dir: /var/lib/ckpt\n";
        let s = resolve(&IDS, yaml, no_env()).expect("ok");
        assert_eq!(
            (s.gc_strategy.as_str(), s.grace_period),
            ("immediate", Duration::from_secs(300))
        );
        assert_eq!(s.namespaces, vec!["cni", "kube-system"]);
        assert_eq!((s.runtime_endpoint, s.metrics_addr), (None, None));
        assert_eq!(s.disk.checkpoint_dir, PathBuf::from("/var/lib/ckpt"));
        let mut argv = IDS.to_vec();
        argv.extend([
            "--gc-strategy",
            "owner-reference",
            "--checkpoint-grace-period",
            "2s",
            "--namespaces",
            "a,b",
            "--checkpoint-dir",
            "/x",
        ]);
        let s = resolve(&argv, yaml, no_env()).expect("ok");
        assert_eq!(
            (s.gc_strategy.as_str(), s.grace_period),
            ("owner-reference", Duration::from_secs(2))
        );
        assert_eq!(s.namespaces, vec!["a", "b"]);
        assert_eq!(s.disk.checkpoint_dir, PathBuf::from("/x"));
        let s = resolve(
            &[],
            "node-name: n\npod-name: p\npod-namespace: ns\nnamespaces: \"x, y\"\n",
            no_env(),
        )
        .expect("ok");
        assert_eq!(
            (s.node_name.as_str(), s.namespaces.clone()),
            ("n", vec!["x".to_owned(), "y".to_owned()])
        );
    }

    /// `--log-level` over `RUST_LOG` (clap) over `log-level:` over `info`; a filter the
    /// agent could not apply is a usage error, not a silently quieter agent.
    #[test]
    fn log_level_from_the_flag_or_the_file() {
        let check = |flag: Option<&str>, yaml: &str, expected: std::result::Result<&str, &str>| {
            let mut argv = IDS.to_vec();
            argv.extend(flag.iter().flat_map(|f| ["--log-level", f]));
            let got = resolve(&argv, yaml, no_env());
            match (got, expected) {
                (Ok(s), Ok(level)) => assert_eq!(s.log_level, level, "{flag:?} {yaml:?}"),
                (Err(e), Err(needle)) => assert!(e.to_string().contains(needle), "{e}"),
                (got, expected) => panic!("{flag:?} {yaml:?}: {got:?}, expected {expected:?}"),
            }
        };
        check(None, "", Ok("info"));
        check(None, "log-level: debug\n", Ok("debug"));
        check(None, "log-level: \"\"\n", Ok("info"));
        check(Some("warn"), "log-level: debug\n", Ok("warn"));
        check(
            None,
            "log-level: info,ckpt_watch=trace\n",
            Ok("info,ckpt_watch=trace"),
        );
        check(None, "log-level: \"ckpt_watch=[\"\n", Err("is not a log filter"));
        check(Some("verbose=plenty"), "", Err("is not a log filter"));
    }

    /// `--metrics-listen` is off unless named, and must be an address the agent can bind.
    #[test]
    fn metrics_listen_is_an_address_or_off() {
        let check = |flag: Option<&str>, yaml: &str, expected: std::result::Result<Option<&str>, &str>| {
            let mut argv = IDS.to_vec();
            argv.extend(flag.iter().flat_map(|f| ["--metrics-listen", f]));
            match (resolve(&argv, yaml, no_env()), expected) {
                (Ok(s), Ok(addr)) => assert_eq!(
                    s.metrics_listen,
                    addr.map(|a| a.parse().unwrap()),
                    "{flag:?} {yaml:?}"
                ),
                (Err(e), Err(needle)) => assert!(e.to_string().contains(needle), "{e}"),
                (got, expected) => panic!("{flag:?} {yaml:?}: {got:?}, expected {expected:?}"),
            }
        };
        check(None, "", Ok(None));
        // "" on the command line turns off what the file names.
        check(Some(""), "metrics-listen: 10.0.0.5:10267\n", Ok(None));
        check(
            None,
            "metrics-listen: 10.0.0.5:10267\n",
            Ok(Some("10.0.0.5:10267")),
        );
        check(Some("[fd00::5]:10267"), "", Ok(Some("[fd00::5]:10267")));
        check(Some("$(HOST_IP):10267"), "", Err("--metrics-listen"));
        check(Some("10.0.0.5"), "", Err("--metrics-listen"));
    }

    /// The service-account token never goes to an unverified kubelet unless asked.
    #[test]
    fn kubelet_trust_follows_the_flags_and_what_is_at_stake() {
        let check = |argv: &[&str], token: bool, expected: std::result::Result<KubeletTrust, &str>| {
            let mut all = IDS.to_vec();
            all.extend(argv);
            let env = Environment {
                service_account_token: token,
                ..no_env()
            };
            let got = resolve(&all, "", env).map(|s| s.kubelet_trust);
            match (got, expected) {
                (Ok(got), Ok(expected)) => assert_eq!(got, expected, "{argv:?} token={token}"),
                (Err(e), Err(expected)) => {
                    let e = ckpt_core::error_chain(&e);
                    assert!(e.contains(expected), "{e:?} should contain {expected:?}");
                }
                (got, expected) => panic!("{argv:?} token={token}: {got:?}, expected {expected:?}"),
            }
        };
        let kubelet = ["--runtime-endpoint", ""];
        // The kubelet over https with a token: a choice must be made.
        check(
            &kubelet,
            true,
            Err("--kubelet-ca: the kubelet API https://127.0.0.1:10250"),
        );
        check(
            &["--runtime-endpoint", "", "--kubelet-ca", "/pki/ca.crt"],
            true,
            Ok(KubeletTrust::Ca(PathBuf::from("/pki/ca.crt"))),
        );
        check(
            &["--runtime-endpoint", "", "--kubelet-insecure"],
            true,
            Ok(KubeletTrust::Unverified),
        );
        check(
            &[
                "--runtime-endpoint",
                "",
                "--kubelet-insecure",
                "--kubelet-ca",
                "/ca",
            ],
            true,
            Err("cannot be used with"),
        );
        // Nothing at stake: no token, plain http, or the kubelet not read (CRI on).
        check(&kubelet, false, Ok(KubeletTrust::Unverified));
        check(
            &[
                "--runtime-endpoint",
                "",
                "--kubelet-url",
                "http://127.0.0.1:10255",
            ],
            true,
            Ok(KubeletTrust::Unverified),
        );
        check(&[], true, Ok(KubeletTrust::Unverified));
        // The config file's keys.
        let s = resolve(&IDS, "runtime-endpoint: \"\"\nkubelet-insecure: true\n", no_env()).expect("ok");
        assert_eq!(s.kubelet_trust, KubeletTrust::Unverified);
        let env = Environment {
            service_account_token: true,
            ..no_env()
        };
        let s = resolve(&IDS, "runtime-endpoint: \"\"\nkubelet-ca: /ca.crt\n", env).expect("ok");
        assert_eq!(s.kubelet_trust, KubeletTrust::Ca(PathBuf::from("/ca.crt")));
    }

    #[test]
    fn the_health_socket_is_off_unless_named() {
        assert_eq!(resolve(&IDS, "", no_env()).expect("ok").health_socket, None);
        let mut argv = IDS.to_vec();
        argv.extend(["--health-socket", "/run/pc/health.sock"]);
        let s = resolve(&argv, "", no_env()).expect("ok");
        assert_eq!(s.health_socket, Some(PathBuf::from("/run/pc/health.sock")));
        let s = resolve(&IDS, "health-socket: /run/x.sock\n", no_env()).expect("ok");
        assert_eq!(s.health_socket, Some(PathBuf::from("/run/x.sock")));
        let mut argv = IDS.to_vec();
        argv.extend(["--health-socket", "health.sock"]);
        let e = resolve(&argv, "", no_env()).expect_err("relative");
        assert!(e.to_string().starts_with("--health-socket"), "{e}");
    }

    #[test]
    fn usage_errors_name_the_flag() {
        let check = |argv: &[&str], yaml: &str, expected: &str| {
            let mut all = IDS.to_vec();
            all.extend(argv);
            let err = ckpt_core::error_chain(&resolve(&all, yaml, no_env()).expect_err("usage error"));
            assert!(err.contains(expected), "{err:?} should contain {expected:?}");
        };
        check(
            &["--gc-strategy", "nope"],
            "",
            "--gc-strategy: unknown GC strategy \"nope\" (known: grace-period, immediate, owner-reference)",
        );
        check(
            &["--checkpoint-grace-period", "5x"],
            "",
            "--checkpoint-grace-period: invalid duration \"5x\"",
        );
        check(
            &["--namespaces", "Kube_System"],
            "",
            "--namespaces: \"Kube_System\" is not a valid namespace name",
        );
        check(&["--metrics-addr", "localhost"], "", "--metrics-addr");
        check(&["--kubelet-url", "127.0.0.1:10250"], "", "--kubelet-url");
        check(&["--runtime-endpoint", "tcp://x:1"], "", "--runtime-endpoint");
        check(&[], "gc:\n  grace-period:\n    nope: 1\n", "--gc-strategy");
        let err = resolve(&["--pod-name", "p", "--pod-namespace", "n"], "", no_env())
            .expect_err("missing")
            .to_string();
        assert_eq!(
            err,
            "--node-name is required (or set NODE_NAME, or `node-name:` in --config)"
        );
        let unknown_key: std::result::Result<FileConfig, _> = serde_saphyr::from_str("gc-stratgy: x\n");
        assert!(unknown_key.is_err());
    }
}
