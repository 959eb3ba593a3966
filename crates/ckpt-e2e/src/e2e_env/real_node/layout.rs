//! Where the real node keeps its files on the host, and how its mount namespace shows them
//! at the paths a node has by default, so the rendered manifests' defaults work unchanged
//! while the machine's own `/etc/kubernetes`, `/var/lib/kubelet`, `/run/containerd` … are
//! never written:
//!
//! ```text
//! <node dir>/disk/etc-kubernetes      -> /etc/kubernetes        (checkpoints, manifests)
//! <node dir>/disk/etc-cni-net.d       -> /etc/cni/net.d         (the node's CNI conflist)
//! <node dir>/disk/var-lib-kubelet     -> /var/lib/kubelet
//! <node dir>/disk/var-lib-containerd  -> /var/lib/containerd    (images, snapshots)
//! <node dir>/disk/var-lib-cni         -> /var/lib/cni           (IPAM leases)
//! <node dir>/disk/var-log-pods        -> /var/log/pods
//! <node dir>/disk/var-log-containers  -> /var/log/containers
//! <node dir>/run                      -> /run                   (wiped by a reboot)
//! <node dir>/sysctl/<key>             -> /proc/sys/<key>        (wall 2)
//! ```
//!
//! `disk/` survives a reboot, `run/` does not: it is the node's tmpfs, holding containerd's
//! socket and state (`/run/containerd`, the shim sockets in `/run/containerd/s`), the lock
//! dir `/run/pod-checkpointer`, the health dir `/run/pod-checkpointer-health` and the pod
//! network namespaces' pins (`/run/netns/cni-*`). The mount points under `/etc` and `/var`
//! may not exist on the machine; creating them there would write the machine's directories,
//! so those trees get a copy-on-write overlay first (`disk/overlay/*/upper`), which takes the
//! mount points and anything else the node writes under them.

use std::path::{Path, PathBuf};

/// The node's "disk" directories and the node paths they are mounted on.
pub(super) const DISK_MOUNTS: [(&str, &str); 7] = [
    ("etc-kubernetes", "/etc/kubernetes"),
    ("etc-cni-net.d", "/etc/cni/net.d"),
    ("var-lib-kubelet", "/var/lib/kubelet"),
    ("var-lib-containerd", "/var/lib/containerd"),
    ("var-lib-cni", "/var/lib/cni"),
    ("var-log-pods", "/var/log/pods"),
    ("var-log-containers", "/var/log/containers"),
];

/// The trees that hold the mount points of [`DISK_MOUNTS`], overlaid copy-on-write.
pub(super) const OVERLAID_TREES: [(&str, &str); 3] =
    [("etc", "/etc"), ("var-lib", "/var/lib"), ("var-log", "/var/log")];

/// The node's `/run`.
pub(super) const RUN: &str = "/run";

/// What kubelet 1.20 insists on setting (`setupKernelTunables`: modify or fail, no warn mode),
/// with the values it wants: shadowed by plain files inside the node's mount namespace, so the
/// machine's sysctls stay as they are.
pub(super) const KUBELET_SYSCTLS: [(&str, &str); 6] = [
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];

/// The default paths of the rendered manifests and the kubelet, as seen inside the node.
pub const MANIFESTS_DIR: &str = "/etc/kubernetes/manifests";
pub const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";
pub const CNI_CONF_DIR: &str = "/etc/cni/net.d";

/// The paths of one node's directory (`<plane work dir>/node`).
#[derive(Clone, Debug)]
pub(super) struct Layout {
    dir: PathBuf,
}

impl Layout {
    pub(super) fn new(dir: &Path) -> Layout {
        Layout { dir: dir.to_owned() }
    }

    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    pub(super) fn state_file(&self) -> PathBuf {
        self.dir.join("real-node.state")
    }

    /// A private bind mount of itself (mount namespace pins need private propagation).
    pub(super) fn ns_dir(&self) -> PathBuf {
        self.dir.join("ns")
    }

    /// The pin of the node's mount namespace.
    pub(super) fn mnt_ns_pin(&self) -> PathBuf {
        self.ns_dir().join("mnt")
    }

    pub(super) fn disk_dir(&self, name: &str) -> PathBuf {
        self.dir.join("disk").join(name)
    }

    pub(super) fn overlay_upper(&self, name: &str) -> PathBuf {
        self.dir.join("disk/overlay").join(name).join("upper")
    }

    pub(super) fn overlay_work(&self, name: &str) -> PathBuf {
        self.dir.join("disk/overlay").join(name).join("work")
    }

    pub(super) fn run_dir(&self) -> PathBuf {
        self.dir.join("run")
    }

    pub(super) fn sysctl_file(&self, key: &str) -> PathBuf {
        self.dir.join("sysctl").join(key.replace('/', "."))
    }

    pub(super) fn containerd_config(&self) -> PathBuf {
        self.dir.join("containerd.toml")
    }

    pub(super) fn images_dir(&self) -> PathBuf {
        self.dir.join("images")
    }

    pub(super) fn log(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.log"))
    }

    pub(super) fn pid_file(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.pid"))
    }

    /// Where a path of the node's own file system lives on the host, for the node's disk and
    /// `/run`; `None` for paths the node shares with the machine (or its overlays).
    pub(super) fn host_path(&self, node_path: &Path) -> Option<PathBuf> {
        let mounts = DISK_MOUNTS
            .iter()
            .map(|(name, target)| (Path::new(target), self.disk_dir(name)))
            .chain([(Path::new(RUN), self.run_dir())]);
        // The longest mount point wins (none of them nest today).
        mounts
            .filter_map(|(target, source)| {
                let rest = node_path.strip_prefix(target).ok()?;
                Some((target.as_os_str().len(), source.join(rest)))
            })
            .max_by_key(|(len, _)| *len)
            .map(|(_, path)| path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_paths_map_to_the_node_dir() {
        let layout = Layout::new(Path::new("/w/node"));
        assert_eq!(
            layout.host_path(Path::new(MANIFESTS_DIR)),
            Some(PathBuf::from("/w/node/disk/etc-kubernetes/manifests"))
        );
        assert_eq!(
            layout.host_path(Path::new(CONTAINERD_SOCKET)),
            Some(PathBuf::from("/w/node/run/containerd/containerd.sock"))
        );
        assert_eq!(
            layout.host_path(Path::new("/var/lib/kubelet")),
            Some(PathBuf::from("/w/node/disk/var-lib-kubelet"))
        );
        assert_eq!(layout.host_path(Path::new("/etc/passwd")), None);
        assert_eq!(layout.host_path(Path::new("/var/lib/kubeletx")), None);
        assert_eq!(
            layout.sysctl_file("kernel/keys/root_maxkeys"),
            PathBuf::from("/w/node/sysctl/kernel.keys.root_maxkeys")
        );
    }

    #[test]
    fn every_mount_point_lies_in_an_overlaid_tree_or_run() {
        for (_, target) in DISK_MOUNTS {
            assert!(
                OVERLAID_TREES
                    .iter()
                    .any(|(_, tree)| Path::new(target).starts_with(tree)),
                "{target} needs a mount point the machine may not have"
            );
        }
        for path in [
            "/run/containerd",
            "/run/pod-checkpointer",
            "/run/pod-checkpointer-health",
        ] {
            assert!(Path::new(path).starts_with(RUN));
        }
    }
}
