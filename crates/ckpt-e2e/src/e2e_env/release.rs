//! The Kubernetes releases the end-to-end environment runs, and what differs between them
//! in how it starts their processes (issue 37): v1.20.2 built from Debian's source package
//! (`build`), and v1.34.4 and v1.37.2 built from their Go modules (`modules`).

/// A Kubernetes release the environment can build and start. The default, what CI and every
/// command run unless told `--kubernetes`, is the newest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Release {
    /// v1.20.2 from Debian bookworm's source package, with Debian's etcd, containerd and
    /// runc: what every scenario has run on so far.
    #[value(name = "1.20")]
    V1_20,
    /// v1.34.4, the oldest release `--long` runs besides: the first kubelet that refuses
    /// static pods referencing API objects by default. With the same etcd, containerd, runc
    /// and CNI plugins as v1.37.
    #[value(name = "1.34")]
    V1_34,
    /// v1.37.2 and etcd 3.6, containerd 2, runc 1.5 from their Go modules.
    #[default]
    #[value(name = "1.37")]
    V1_37,
}

impl Release {
    /// The version its components report.
    pub const fn version(self) -> &'static str {
        match self {
            // The source package is `1.20.5+really1.20.2`.
            Release::V1_20 => "1.20.2",
            Release::V1_34 => "1.34.4",
            Release::V1_37 => "1.37.2",
        }
    }

    /// What runs with it: etcd and the real node's runtime.
    pub fn components(self) -> &'static str {
        match self {
            Release::V1_20 => {
                "Debian bookworm's source build; Debian's etcd 3.4, containerd 1.6, runc 1.1, CNI plugins 1.1"
            }
            Release::V1_34 | Release::V1_37 => {
                "built from its Go modules with etcd 3.6.16, containerd 2.4.2, runc 1.5.3, CNI plugins 1.10.0"
            }
        }
    }

    /// Its `MAJOR.MINOR`, as `--kubernetes` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Release::V1_20 => "1.20",
            Release::V1_34 => "1.34",
            Release::V1_37 => "1.37",
        }
    }

    /// Built from its Go modules (`modules`) with containerd 2 and runc 1.5, rather than
    /// from Debian's source with Debian's runtime (v1.20).
    pub fn from_modules(self) -> bool {
        self != Release::V1_20
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

    /// The socket kubemark's fake CRI listens on when it is not kubemark 1.20's fixed
    /// `/tmp/kubelet_remote.sock`: the Go modules' build fixes the current releases' random
    /// one (`modules::HOLLOW_NODE_PATCHES`), and the harness links the old name to it.
    pub(crate) fn hollow_cri_socket(self) -> Option<&'static str> {
        self.from_modules().then_some("/tmp/kubelet_remote_0.sock")
    }

    /// kubemark's hollow kubelet pulls images through the host's containerd unless told
    /// `--use-host-image-service=false` (1.20 has no such flag).
    pub(crate) fn hollow_uses_host_image_service(self) -> bool {
        self.from_modules()
    }

    /// The `GODEBUG` the plane's kube-apiserver runs with. The test pods' only HTTPS client
    /// is busybox 1.35's wget, whose TLS 1.2 ClientHello offers no signature algorithms, so
    /// the server may only sign its key exchange with SHA-1 (RFC 5246 §7.4.1.4.1); Go 1.25
    /// and later refuse that unless `tlssha1=1` (1.20's Go 1.19 build allowed it). Only the
    /// host-run test plane gets it: the agent speaks TLS 1.3 through rustls, and the
    /// self-hosted API server keeps Go's default.
    pub(crate) fn apiserver_godebug(self) -> Option<&'static str> {
        self.from_modules().then_some("tlssha1=1")
    }

    /// kube-controller-manager's name for the legacy token Secrets' controller.
    pub(crate) fn token_controller(self) -> &'static str {
        match self {
            Release::V1_20 => "serviceaccount-token",
            Release::V1_34 | Release::V1_37 => "serviceaccount-token-controller",
        }
    }
}

/// The variable `cargo xtask e2e --kubernetes` sets for the suite.
pub const RELEASE_ENV: &str = "E2E_KUBERNETES";

impl Release {
    /// The release `E2E_KUBERNETES` names (the default when unset or empty).
    pub fn from_env() -> anyhow::Result<Release> {
        match std::env::var(RELEASE_ENV) {
            Ok(v) if !v.is_empty() => <Release as clap::ValueEnum>::from_str(&v, false)
                .map_err(|e| anyhow::anyhow!("{RELEASE_ENV}={v}: {e}")),
            _ => Ok(Release::default()),
        }
    }
}

impl std::fmt::Display for Release {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "v{}", self.version())
    }
}
