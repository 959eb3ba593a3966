//! The Kubernetes releases the end-to-end environment runs, and what differs between them
//! in how it starts their processes (issue 37): v1.20.2 built from Debian's source package
//! (`build`) and v1.37.2 built from its Go modules (`modules`).

/// A Kubernetes release the environment can build and start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Release {
    /// v1.20.2 from Debian bookworm's source package, with Debian's etcd, containerd and
    /// runc: what every scenario has run on so far.
    #[value(name = "1.20")]
    V1_20,
    /// v1.37.2 and etcd 3.6, containerd 2, runc 1.5 from their Go modules.
    #[value(name = "1.37")]
    V1_37,
}

impl Release {
    /// The version its components report.
    pub const fn version(self) -> &'static str {
        match self {
            // The source package is `1.20.5+really1.20.2`.
            Release::V1_20 => "1.20.2",
            Release::V1_37 => "1.37.2",
        }
    }

    /// Its `MAJOR.MINOR`, as `--kubernetes` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Release::V1_20 => "1.20",
            Release::V1_37 => "1.37",
        }
    }

    /// The feature gates kube-apiserver and kube-controller-manager need for projected,
    /// bound service-account tokens: alpha in 1.20, GA and gone from the gate list since.
    pub(crate) fn bound_token_gates(self) -> Option<&'static str> {
        (self == Release::V1_20).then_some("--feature-gates=BoundServiceAccountTokenVolume=true")
    }

    /// kube-controller-manager's and kube-scheduler's insecure port is turned off by
    /// `--port=0` in 1.20; the flag is gone since 1.24.
    pub(crate) fn has_insecure_port_flag(self) -> bool {
        self == Release::V1_20
    }

    /// kube-controller-manager's name for the legacy token Secrets' controller.
    pub(crate) fn token_controller(self) -> &'static str {
        match self {
            Release::V1_20 => "serviceaccount-token",
            Release::V1_37 => "serviceaccount-token-controller",
        }
    }
}

impl std::fmt::Display for Release {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "v{}", self.version())
    }
}
