//! The defaults of the install's flags. The first ones are also the agent's own (its
//! `run` flags default to them, so a render without flags matches an agent run without
//! them); the agent's configuration reads them from here.

/// The kubelet's static pod directory.
pub const DEFAULT_MANIFESTS_DIR: &str = "/etc/kubernetes/manifests";
/// In a directory only root can write (any local user can create files in bootkube's
/// `/var/run/lock`), on the tmpfs `/run`, so no holder record outlives a reboot.
pub const DEFAULT_LOCK_FILE: &str = "/run/pod-checkpointer/pod-checkpointer.lock";
pub const DEFAULT_RUNTIME_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";
/// Health and metrics on loopback: nothing off the node reaches them, and the port is one
/// no core component uses (8080 is crowded on control-plane hosts).
pub const DEFAULT_METRICS_PORT: u16 = 10266;
/// `--log-level` when neither the flag, `RUST_LOG` nor the config file names one.
pub const DEFAULT_LOG_LEVEL: &str = "info";

pub const DEFAULT_NAMESPACE: &str = "kube-system";
/// The `apiVersion` of the agent's `--config` file: the keys it may hold and what they mean.
pub const CONFIG_API_VERSION: &str = "pod-checkpointer.github.io/v1alpha1";
/// The `kind` of the agent's `--config` file.
pub const CONFIG_KIND: &str = "AgentConfig";
/// The agent keeps the control plane's own pods bootable: evicted last, scheduled first.
pub const DEFAULT_PRIORITY_CLASS: &str = "system-node-critical";
/// The agent's container asks for this much memory; a `--memory-limit` below it is refused.
pub const MEMORY_REQUEST: &str = "32Mi";
/// The nodes the DaemonSet runs on when no `--node-label` says otherwise: either
/// control-plane role label (`master` before 1.24 and on bootkube clusters), or Typhoon's
/// controller label. (key, value): no value means any value.
pub const CONTROL_PLANE_LABELS: [(&str, Option<&str>); 3] = [
    ("node-role.kubernetes.io/control-plane", None),
    ("node-role.kubernetes.io/master", None),
    ("node.kubernetes.io/controller", Some("true")),
];
pub const DEFAULT_IMAGE: &str = concat!(
    "ghcr.io/pod-checkpointer/pod-checkpointer:",
    env!("CARGO_PKG_VERSION")
);
pub const DEFAULT_GRACE_PERIOD: &str = "1m";
/// Default `--handoff-timeout` (the agent's own default).
pub const DEFAULT_HANDOFF_TIMEOUT: &str = "2m";
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
