//! `ckpt-render`: the Kubernetes objects that install pod-checkpointer, built as typed
//! k8s-openapi values and written as commented YAML: what `pod-checkpointer render` prints
//! and `cargo xtask deploy` applies, so installing needs the binary and no Rust toolchain.
//!
//! - [`ManifestArgs`]: the flags (a `clap::Args`); [`ManifestArgs::options_for`] checks them,
//!   and the agent config they imply, against the agent that will run them
//!   ([`AgentChecks`]), into [`ManifestOptions`].
//! - [`render`]: every object of the install, in apply order, as [`Manifest`]s;
//!   [`to_yaml`]: the YAML, each RBAC rule with its reason above it.
//! - [`KubernetesVersion`]: the oldest cluster the manifests must work with.
//! - [`ALERTS`]: the PrometheusRule's alerts (`--prometheus`).
//! - [`defaults`]: the flags' defaults, the agent's own among them.
//! - [`Error`]: a flag or config the agent refuses, or YAML that cannot be written.
//!
//! What the manifests promise:
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
//!
//! ```
//! use ckpt_render::{AgentChecks, KubernetesVersion, ManifestArgs, render, to_yaml};
//!
//! /// Stands in for the agent binary: `ckpt_bin::render::BuiltIn` asks the real one.
//! struct Agent;
//!
//! impl AgentChecks for Agent {
//!     fn strategies(&self) -> ckpt_render::Result<Vec<String>> {
//!         Ok(vec!["grace-period".to_owned()])
//!     }
//!     fn check_config(&self, _yaml: &str) -> ckpt_render::Result<()> {
//!         Ok(())
//!     }
//! }
//!
//! let args = ManifestArgs {
//!     namespaces: vec!["monitoring".to_owned()],
//!     ..ManifestArgs::default()
//! };
//! let options = args.options_for(KubernetesVersion::NEWEST, &Agent)?;
//! let yaml = to_yaml(&render(&options))?;
//! assert!(yaml.contains("kind: DaemonSet"));
//! assert!(yaml.contains("namespace: monitoring"), "a Role in each checkpointed namespace");
//! # Ok::<(), ckpt_render::Error>(())
//! ```

pub mod defaults;
mod error;
mod manifest;
mod monitoring;
mod objects;
mod options;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod version;
mod yaml;

use std::collections::BTreeMap;

pub use defaults::*;
pub use error::{Error, Result};
pub use manifest::Manifest;
pub use monitoring::{ALERTS, Alert, expr as alert_expr};
pub use objects::render;
pub use options::{
    AgentChecks, ApiEndpoint, IN_CLUSTER, KubeletTrust, LogFormat, ManifestArgs, ManifestOptions, NodeLabel,
    check_strategy,
};
pub use version::KubernetesVersion;
pub use yaml::to_yaml;

/// The name of the agent's ServiceAccount and of most objects (roles, bindings, ConfigMap,
/// DaemonSet).
pub const NAME: &str = "pod-checkpointer";
/// The static copy's ServiceAccount: the same read-only roles as the agent's, and no right
/// to mint tokens. The agent mints its tokens (the kept credentials).
pub const STATIC_NAME: &str = "pod-checkpointer-static";
/// The label that selects the DaemonSet's pods (and marks every object we install).
pub const NAME_LABEL: &str = "app.kubernetes.io/name";

/// The labels of every object we install.
fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([(NAME_LABEL.to_owned(), NAME.to_owned())])
}

/// The README's example, compiled and run with the doctests so it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeExample;

#[cfg(test)]
mod tests;
