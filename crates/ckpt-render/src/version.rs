//! [`KubernetesVersion`]: the oldest Kubernetes the manifests must work with, and the
//! choices that follow from it.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// A Kubernetes `major.minor` version: the oldest API server or kubelet the manifests
/// must work with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct KubernetesVersion {
    pub major: u32,
    pub minor: u32,
}

impl KubernetesVersion {
    /// The API level of the workspace's k8s-openapi feature (`v1_37`).
    pub const NEWEST: KubernetesVersion = KubernetesVersion::new(1, 37);

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
