//! The node's containerd configuration, CNI network and kubelet flags. Paths are the node's
//! own (see [`layout`](super::layout)): containerd and the kubelet run with their defaults.

use std::path::Path;

use super::images::PAUSE_IMAGE;
use super::layout::{CNI_CONF_DIR, CONTAINERD_SOCKET, MANIFESTS_DIR};
use crate::e2e_env::build::NodeRuntime;
use crate::e2e_env::node_network::NodeNetwork;
use crate::e2e_env::release::Release;

/// The kubelet's API ports on the node's address (their defaults).
pub const KUBELET_PORT: u16 = 10250;
pub const KUBELET_READ_ONLY_PORT: u16 = 10255;

/// The kubelet's hard eviction thresholds: what a node really cannot run below.
pub(super) const EVICTION_HARD: &str =
    "memory.available<100Mi,nodefs.available<1Gi,imagefs.available<1Gi,nodefs.inodesFree<1%";

/// The CNI conflist's file name in the node's `/etc/cni/net.d`.
pub(super) const CNI_CONFLIST: &str = "10-pod-checkpointer-node.conflist";

/// containerd's configuration: version 2 for Debian's 1.6, version 3 for containerd 2 (whose
/// CRI plugin is split in three: images, runtime, and the gRPC server). Everything it keeps
/// lives under the node's `/var/lib/containerd` (disk) and `/run/containerd` (lost on reboot).
pub(super) fn containerd_toml(runtime: &NodeRuntime) -> String {
    let head = format!(
        r#"# The real node's containerd (cargo xtask e2e-env start --real-node).
version = {version}
root = "/var/lib/containerd"
state = "/run/containerd"
# Keep containerd's own score: a negative one needs CAP_SYS_RESOURCE.
oom_score = 0

[grpc]
  address = "{CONTAINERD_SOCKET}"

[ttrpc]
  address = "{CONTAINERD_SOCKET}.ttrpc"

[debug]
  address = ""
  level = "info"

[metrics]
  address = ""

[plugins]
  # Its default, /opt/containerd, is the machine's.
  [plugins."io.containerd.internal.v1.opt"]
    path = "/var/lib/containerd/opt"
"#,
        version = if runtime.containerd_major() >= 2 { 3 } else { 2 },
    );
    let cni_bin_dir = runtime.cni_bin_dir().display();
    let plugins = if runtime.containerd_major() >= 2 {
        let runc = runtime.runc().display().to_string();
        format!(
            r#"
  [plugins."io.containerd.grpc.v1.cri"]
    # In the node's network namespace; the kubelet proxies exec and attach to it.
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"

  [plugins."io.containerd.cri.v1.images"]
    snapshotter = "overlayfs"
    [plugins."io.containerd.cri.v1.images".pinned_images]
      sandbox = "{PAUSE_IMAGE}"

  [plugins."io.containerd.cri.v1.runtime"]
    # Wall 1: without CAP_SYS_RESOURCE runc cannot set the kubelet's negative scores
    # (-998 for sandboxes); clamp them to containerd's own.
    restrict_oom_score_adj = true
    disable_apparmor = true
    [plugins."io.containerd.cri.v1.runtime".cni]
      bin_dirs = ["{cni_bin_dir}"]
      conf_dir = "{CNI_CONF_DIR}"
    [plugins."io.containerd.cri.v1.runtime".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
          SystemdCgroup = false
          BinaryName = "{runc}"
"#
        )
    } else {
        format!(
            r#"
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "{PAUSE_IMAGE}"
    # In the node's network namespace; the kubelet proxies exec and attach to it.
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    # Wall 1: without CAP_SYS_RESOURCE runc cannot set the kubelet's negative scores
    # (-998 for sandboxes); clamp them to containerd's own.
    restrict_oom_score_adj = true
    disable_apparmor = true
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "{cni_bin_dir}"
      conf_dir = "{CNI_CONF_DIR}"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
"#
        )
    };
    head + &plugins
}

/// A bridge with host-local addresses from the pod CIDR; the bridge is the pods' gateway. No
/// masquerading (there are no iptables): the host routes the pod CIDR to the node instead.
pub(super) fn cni_conflist(network: &NodeNetwork) -> String {
    let conflist = serde_json::json!({
        "cniVersion": "0.4.0",
        "name": "pod-checkpointer-node",
        "plugins": [{
            "type": "bridge",
            "bridge": network.bridge,
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "ranges": [[{ "subnet": network.pod_cidr_text() }]],
                "routes": [{ "dst": "0.0.0.0/0" }]
            }
        }]
    });
    format!("{conflist:#}\n")
}

/// The kubelet's flags: the node's identity and address, containerd's CRI, the defaults
/// the rendered manifests assume (static pods in /etc/kubernetes/manifests, root dir
/// /var/lib/kubelet), and what this machine needs (see reference/real-node, walls 1-5).
/// Every flag is still accepted by 1.37 (deprecated in favour of its config file, with a
/// warning each); what differs by release is in [`release_kubelet_args`].
pub(super) fn kubelet_args(
    release: Release,
    name: &str,
    network: &NodeNetwork,
    kubeconfig: &Path,
) -> Vec<String> {
    let node_ip = network.node_ip;
    let mut args = vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--hostname-override={name}"),
        // Wall 3: a loopback node IP is refused; the apiserver reaches the kubelet here.
        format!("--node-ip={node_ip}"),
        format!("--address={node_ip}"),
        format!("--port={KUBELET_PORT}"),
        format!("--read-only-port={KUBELET_READ_ONLY_PORT}"),
        format!("--pod-manifest-path={MANIFESTS_DIR}"),
        // Inotify sees new manifests at once; the relist only bounds a missed event.
        "--file-check-frequency=2s".into(),
        // Secret and ConfigMap volumes follow their objects within ~10 s instead of ~1 min.
        "--sync-frequency=10s".into(),
        format!("--container-runtime-endpoint=unix://{CONTAINERD_SOCKET}"),
        "--runtime-request-timeout=2m".into(),
        "--cgroup-driver=cgroupfs".into(),
        // No QoS hierarchy and no allocatable enforcement: containers get /k8s.io/<id>.
        "--cgroups-per-qos=false".into(),
        "--enforce-node-allocatable=".into(),
        "--fail-swap-on=false".into(),
        // A negative score (its default, -999) needs CAP_SYS_RESOURCE.
        "--oom-score-adj=0".into(),
        // Wall 5: there is no iptables binary.
        "--make-iptables-util-chains=false".into(),
        // Its default is under /usr/libexec, which it would create.
        "--volume-plugin-dir=/var/lib/kubelet/volume-plugins".into(),
        // Nothing can be pulled back: never collect images.
        "--image-gc-high-threshold=100".into(),
        "--image-gc-low-threshold=99".into(),
        // The node's disk is the machine's, shared with builds and caches: the defaults
        // (nodefs < 10 %, imagefs < 15 % of a large disk) set DiskPressure while tens of GiB
        // are free, and the kubelet then evicts the test's pods. Absolute floors instead.
        format!("--eviction-hard={EVICTION_HARD}"),
        "--v=2".into(),
    ];
    args.extend(release_kubelet_args(release));
    args
}

/// The flags one release needs and the other does not have.
fn release_kubelet_args(release: Release) -> Vec<String> {
    match release {
        Release::V1_20 => vec![
            // Removed in 1.27 (remote is the only runtime since dockershim went).
            "--container-runtime=remote".into(),
            // Removed in 1.35: the sandbox image is the runtime's (containerd's pinned one).
            format!("--pod-infra-container-image={PAUSE_IMAGE}"),
        ],
        Release::V1_34 | Release::V1_37 => vec![
            // From 1.35 the kubelet refuses to start on cgroup v1, this machine's hierarchy,
            // unless told (cgroup v1 is deprecated: a node that keeps it needs this too).
            "--fail-cgroupv1=false".into(),
        ],
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn containerd_clamps_oom_scores_and_uses_the_node_paths() {
        let toml = containerd_toml(&NodeRuntime::debian());
        assert!(toml.contains("version = 2"));
        assert!(toml.contains("restrict_oom_score_adj = true"));
        assert!(toml.contains(r#"address = "/run/containerd/containerd.sock""#));
        assert!(toml.contains(r#"root = "/var/lib/containerd""#));
        assert!(toml.contains(r#"bin_dir = "/usr/lib/cni""#));
        assert!(toml.contains(&format!(r#"sandbox_image = "{PAUSE_IMAGE}""#)));
        assert!(toml.contains(r#"path = "/var/lib/containerd/opt""#));
    }

    #[test]
    fn the_cni_bridge_serves_the_pod_cidr() {
        let conflist: serde_json::Value =
            serde_json::from_str(&cni_conflist(&NodeNetwork::project())).unwrap();
        let bridge = &conflist["plugins"][0];
        assert_eq!(bridge["bridge"], "pckpt-br0");
        assert_eq!(bridge["ipMasq"], false);
        assert_eq!(bridge["ipam"]["ranges"][0][0]["subnet"], "10.213.1.0/24");
    }

    #[test]
    fn the_kubelet_registers_node_1_on_the_node_address() {
        let args = kubelet_args(
            Release::V1_20,
            crate::e2e_env::NODE_NAME,
            &NodeNetwork::project(),
            Path::new("/w/kubeconfig-node-1"),
        );
        for expected in [
            "--kubeconfig=/w/kubeconfig-node-1",
            "--hostname-override=node-1",
            "--node-ip=10.213.0.2",
            "--address=10.213.0.2",
            "--pod-manifest-path=/etc/kubernetes/manifests",
            "--container-runtime-endpoint=unix:///run/containerd/containerd.sock",
            "--oom-score-adj=0",
            "--eviction-hard=memory.available<100Mi,nodefs.available<1Gi,imagefs.available<1Gi,nodefs.inodesFree<1%",
        ] {
            assert!(args.contains(&expected.to_owned()), "missing {expected}");
        }
        assert!(
            !args.iter().any(|a| a.starts_with("--root-dir")),
            "the default root dir"
        );
        assert!(args.contains(&"--container-runtime=remote".to_owned()));
    }

    #[test]
    fn containerd_2_reads_version_3_with_the_built_runc_and_plugins() {
        let runtime = NodeRuntime::built("/c/containerd-2".into(), "/c/runc-1/runc".into(), "/c/cni".into());
        let toml = containerd_toml(&runtime);
        for expected in [
            "version = 3",
            r#"[plugins."io.containerd.cri.v1.runtime"]"#,
            "restrict_oom_score_adj = true",
            r#"bin_dirs = ["/c/cni"]"#,
            r#"BinaryName = "/c/runc-1/runc""#,
            &format!(r#"sandbox = "{PAUSE_IMAGE}""#),
        ] {
            assert!(toml.contains(expected), "missing {expected}:\n{toml}");
        }
        // containerd 2 ignores (with a warning) the keys its CRI plugin moved elsewhere.
        assert!(!toml.contains("sandbox_image"));
        assert_eq!(
            runtime.path_dirs(),
            [PathBuf::from("/c/containerd-2"), PathBuf::from("/c/runc-1")]
        );
    }

    #[test]
    fn kubelet_1_37_runs_on_cgroup_v1_without_the_removed_flags() {
        let args = kubelet_args(
            Release::V1_37,
            "node-2",
            &NodeNetwork::project(),
            Path::new("/w/kubeconfig-node-1"),
        );
        assert!(args.contains(&"--fail-cgroupv1=false".to_owned()));
        assert!(args.contains(&"--hostname-override=node-2".to_owned()));
        for removed in ["--container-runtime=", "--pod-infra-container-image="] {
            assert!(!args.iter().any(|a| a.starts_with(removed)), "{removed} is gone");
        }
    }
}
