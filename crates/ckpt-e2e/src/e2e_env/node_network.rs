//! The real node's network: a network namespace the project creates, joined to the host by a
//! veth pair with addresses the project chose, and nothing else (reference/real-node/NETNS.md).
//!
//! ```text
//! host netns                                 netns pod-checkpointer-node
//!  kube-apiserver 10.213.0.1:PORT             containerd, kubelet 10.213.0.2:10250
//!  pckpt-host 10.213.0.1/30  <== veth ==>     pckpt-node 10.213.0.2/30, lo; NO default route
//!  route 10.213.1.0/24 via 10.213.0.2         pckpt-br0 10.213.1.1/24 (CNI bridge), pod veths
//! ```
//!
//! The node namespace has only connected routes, so nothing in it can reach beyond the host
//! end of the veth; the host route sends replies to pod IPs back through the veth instead of
//! the machine's default route. The machine's own interfaces and sysctls are never touched:
//! the bridge plugin's `ip_forward=1` lands in the node namespace.

use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use crate::command::{command_line, run_command};

/// Where `ip netns` pins named network namespaces.
pub(super) const NETNS_RUN_DIR: &str = "/run/netns";

/// The addresses and names of the node network. [`NodeNetwork::project`] is the one the real
/// node uses; one node network per machine, since the names are fixed. The nodes of a
/// [`Lan`](super::lan::Lan) have theirs from [`Lan::project`](super::lan::Lan::project).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeNetwork {
    /// The network namespace, pinned at `/run/netns/<netns>` (`ip netns exec` finds it).
    pub netns: String,
    /// The veth end outside the node ([`uplink`](Self::uplink)'s namespace): on the machine
    /// it holds [`host_ip`](Self::host_ip); on a LAN it is a port of the LAN's bridge.
    pub host_link: String,
    /// The veth end in the node namespace, holding [`node_ip`](Self::node_ip).
    pub node_link: String,
    pub host_ip: Ipv4Addr,
    pub node_ip: Ipv4Addr,
    /// The veth subnet's prefix length (a /30: the two ends and nothing else).
    pub prefix_len: u8,
    /// The CNI bridge inside the node namespace; pods get addresses in [`pod_cidr`](Self::pod_cidr).
    pub bridge: String,
    pub pod_cidr: Ipv4Addr,
    pub pod_prefix_len: u8,
    /// Where the veth's other end is.
    #[serde(default)]
    pub uplink: Uplink,
}

/// Where a node network's veth leads, and so where [`NodeNetwork::host_ip`] is: the address at
/// which the node reaches the plane.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Uplink {
    /// The machine's namespace (the single real node): the host end holds `host_ip` and the
    /// machine routes the pod CIDR to the node.
    #[default]
    Host,
    /// A port of the bridge `bridge` in the LAN's namespace `netns`, whose own address is
    /// `host_ip`. The node routes the other nodes' pod CIDRs to them (`routes`: CIDR, via).
    Lan {
        netns: String,
        bridge: String,
        routes: Vec<(String, Ipv4Addr)>,
    },
}

impl NodeNetwork {
    /// The project's node network: 10.213.0.1 (host) ↔ 10.213.0.2 (node), pods in
    /// 10.213.1.0/24 (interface names have at most 15 bytes).
    pub fn project() -> NodeNetwork {
        NodeNetwork {
            netns: "pod-checkpointer-node".into(),
            host_link: "pckpt-host".into(),
            node_link: "pckpt-node".into(),
            host_ip: Ipv4Addr::new(10, 213, 0, 1),
            node_ip: Ipv4Addr::new(10, 213, 0, 2),
            prefix_len: 30,
            bridge: "pckpt-br0".into(),
            pod_cidr: Ipv4Addr::new(10, 213, 1, 0),
            pod_prefix_len: 24,
            uplink: Uplink::Host,
        }
    }

    /// `/run/netns/<netns>`, for `nsenter --net=`.
    pub fn netns_path(&self) -> PathBuf {
        Path::new(NETNS_RUN_DIR).join(&self.netns)
    }

    /// `10.213.1.0/24`.
    pub fn pod_cidr_text(&self) -> String {
        format!("{}/{}", self.pod_cidr, self.pod_prefix_len)
    }

    /// The CNI bridge's address, the pods' gateway: the first address of the pod CIDR.
    pub fn bridge_ip(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.pod_cidr) + 1)
    }

    /// Whether the namespace is pinned (by us or by a run that did not clean up).
    pub fn exists(&self) -> bool {
        self.netns_path().exists()
    }

    /// Creates the namespace, the veth pair, the addresses and the uplink's route to the pod
    /// CIDR (and, on a LAN, the node's routes to the other nodes' pods). Returns whether
    /// `/run/netns` had to be created (then [`remove`](Self::remove) removes it again when it
    /// is empty). A failure undoes what was done. A LAN's namespace must exist first.
    pub fn create(&self) -> anyhow::Result<bool> {
        self.preflight()?;
        let run_dir_existed = Path::new(NETNS_RUN_DIR).exists();
        let host_addr = format!("{}/{}", self.host_ip, self.prefix_len);
        let node_addr = format!("{}/{}", self.node_ip, self.prefix_len);
        let pod_cidr = self.pod_cidr_text();
        let node_ip = self.node_ip.to_string();
        let in_node = |args: &[&str]| -> Vec<String> {
            ["-n", self.netns.as_str()]
                .into_iter()
                .chain(args.iter().copied())
                .map(str::to_owned)
                .collect()
        };
        let mut steps: Vec<Vec<String>> = vec![
            vec!["netns".into(), "add".into(), self.netns.clone()],
            self.in_outside(&[
                "link",
                "add",
                &self.host_link,
                "type",
                "veth",
                "peer",
                "name",
                &self.node_link,
                "netns",
                &self.netns,
            ]),
        ];
        match &self.uplink {
            Uplink::Host => steps.push(self.in_outside(&["addr", "add", &host_addr, "dev", &self.host_link])),
            Uplink::Lan { bridge, .. } => {
                steps.push(self.in_outside(&["link", "set", &self.host_link, "master", bridge]));
            }
        }
        steps.extend([
            self.in_outside(&["link", "set", &self.host_link, "up"]),
            in_node(&["link", "set", "lo", "up"]),
            in_node(&["addr", "add", &node_addr, "dev", &self.node_link]),
            in_node(&["link", "set", &self.node_link, "up"]),
            // Before any pod starts: replies to pod IPs must not follow the default route.
            self.in_outside(&[
                "route",
                "add",
                &pod_cidr,
                "via",
                &node_ip,
                "dev",
                self.uplink_device(),
            ]),
        ]);
        if let Uplink::Lan { routes, .. } = &self.uplink {
            for (cidr, via) in routes {
                steps.push(in_node(&["route", "add", cidr, "via", &via.to_string()]));
            }
        }
        for step in steps {
            let step: Vec<&str> = step.iter().map(String::as_str).collect();
            if let Err(e) = ip(&step) {
                let _ = self.remove(!run_dir_existed);
                return Err(e.context(format!("cannot create the node network {}", self.netns)));
            }
        }
        Ok(!run_dir_existed)
    }

    /// The outside device that routes to the node: the host end, or the LAN's bridge.
    fn uplink_device(&self) -> &str {
        match &self.uplink {
            Uplink::Host => &self.host_link,
            Uplink::Lan { bridge, .. } => bridge,
        }
    }

    /// `ip` arguments `args` for the namespace of the veth's other end: as they are for the
    /// machine's, after `-n LAN` for a LAN's.
    fn in_outside(&self, args: &[&str]) -> Vec<String> {
        let netns = match &self.uplink {
            Uplink::Host => None,
            Uplink::Lan { netns, .. } => Some(["-n", netns.as_str()]),
        };
        netns
            .into_iter()
            .flatten()
            .chain(args.iter().copied())
            .map(str::to_owned)
            .collect()
    }

    /// Removes the route, the veth pair and the namespace (its links go with it), then
    /// `/run/netns` itself when `remove_run_dir` and nothing else is pinned there. Call it once
    /// the node's processes are gone and its mount namespace is unpinned: until then they keep
    /// the namespace alive, though unnamed. Idempotent.
    pub fn remove(&self, remove_run_dir: bool) -> anyhow::Result<()> {
        let pod_cidr = self.pod_cidr_text();
        let mut errors = Vec::new();
        let outside_exists = match &self.uplink {
            Uplink::Host => true,
            Uplink::Lan { netns, .. } => Path::new(NETNS_RUN_DIR).join(netns).exists(),
        };
        if outside_exists && self.host_link_exists() {
            let route = self.in_outside(&["route", "del", &pod_cidr, "dev", self.uplink_device()]);
            let _ = ip(&route.iter().map(String::as_str).collect::<Vec<_>>());
            let del = self.in_outside(&["link", "del", &self.host_link]);
            if let Err(e) = ip(&del.iter().map(String::as_str).collect::<Vec<_>>()) {
                errors.push(format!("{e:#}"));
            }
        }
        if self.exists()
            && let Err(e) = ip(&["netns", "del", &self.netns])
        {
            errors.push(format!("{e:#}"));
        }
        if remove_run_dir {
            remove_empty_netns_dir();
        }
        if !errors.is_empty() {
            bail!(
                "cannot remove the node network {}: {}",
                self.netns,
                errors.join("; ")
            );
        }
        Ok(())
    }

    /// Whether the veth's outside end exists (in the machine's namespace or the LAN's).
    pub fn host_link_exists(&self) -> bool {
        match &self.uplink {
            Uplink::Host => link_exists(&self.host_link),
            Uplink::Lan { netns, .. } => {
                Path::new(NETNS_RUN_DIR).join(netns).exists()
                    && ip(&["-n", netns, "link", "show", &self.host_link]).is_ok()
            }
        }
    }

    /// The routes of the node namespace (`ip -n NETNS route`), one per line.
    pub fn node_routes(&self) -> anyhow::Result<String> {
        ip(&["-n", &self.netns, "route", "show"])
    }

    /// Fails when a name or address of this network is already in use on the machine.
    fn preflight(&self) -> anyhow::Result<()> {
        if self.exists() {
            bail!(
                "the network namespace {} exists: is a real node running (or left over)? \
                 `cargo xtask e2e-env stop --workdir …` stops one; `ip netns del {}` removes a leftover",
                self.netns,
                self.netns
            );
        }
        let machine_links = match self.uplink {
            Uplink::Host => vec![&self.host_link, &self.node_link, &self.bridge],
            // The LAN's ports live in its namespace, created fresh by its preflight.
            Uplink::Lan { .. } => vec![&self.node_link],
        };
        for link in machine_links {
            if link_exists(link) {
                bail!(
                    "the network interface {link} exists on the host: a leftover real node? (`ip link del {link}`)"
                );
            }
        }
        let addresses = ip(&["-4", "-o", "addr", "show"])?;
        let taken = match self.uplink {
            Uplink::Host => vec![self.host_ip, self.node_ip],
            Uplink::Lan { .. } => vec![self.node_ip],
        };
        for taken in taken {
            let needle = format!(" {taken}/");
            if addresses.contains(&needle) {
                bail!("the address {taken} is already assigned on the host; the node network needs it");
            }
        }
        Ok(())
    }
}

pub(super) fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// `ip ARGS…`; fails with the command and its stderr.
pub(super) fn ip(args: &[&str]) -> anyhow::Result<String> {
    let mut command = Command::new("ip");
    command.args(args);
    run_command(&mut command).with_context(|| format!("`{}`", command_line(&command)))
}

/// `ip netns add` made `/run/netns` a shared bind mount of itself: once nothing is pinned
/// there any more, unmount and remove it.
pub(super) fn remove_empty_netns_dir() {
    let dir = Path::new(NETNS_RUN_DIR);
    let empty = fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_none());
    if !empty {
        return;
    }
    if is_mount_point(dir) {
        let _ = run_command(Command::new("umount").arg(dir));
    }
    let _ = fs::remove_dir(dir);
}

/// Whether `path` is a mount point in this process's mount namespace.
pub(crate) fn is_mount_point(path: &Path) -> bool {
    let Ok(mountinfo) = fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let wanted = path.to_string_lossy();
    mountinfo.lines().any(|line| {
        line.split(' ')
            .nth(4)
            .is_some_and(|mount_point| unescape_mountinfo(mount_point) == wanted)
    })
}

/// Mount points in `/proc/PID/mountinfo` escape space, tab, newline and backslash as `\ooo`.
pub(crate) fn unescape_mountinfo(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(pos) = rest.find('\\') {
        out.push_str(&rest[..pos]);
        let code = rest.get(pos + 1..pos + 4);
        match code.and_then(|c| u8::from_str_radix(c, 8).ok()) {
            Some(byte) => {
                out.push(char::from(byte));
                rest = &rest[pos + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[pos + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_project_network_is_a_slash_30_and_a_pod_subnet() {
        let network = NodeNetwork::project();
        assert_eq!(
            network.netns_path(),
            Path::new("/run/netns/pod-checkpointer-node")
        );
        assert_eq!(network.pod_cidr_text(), "10.213.1.0/24");
        assert_eq!(network.bridge_ip(), Ipv4Addr::new(10, 213, 1, 1));
        for name in [&network.host_link, &network.node_link, &network.bridge] {
            assert!(name.len() <= 15, "{name} is too long for an interface name");
        }
    }

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape_mountinfo("/tmp/a\\040b"), "/tmp/a b");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
        assert_eq!(unescape_mountinfo("/x\\134y"), "/x\\y");
        assert_eq!(unescape_mountinfo("/bad\\9"), "/bad\\9");
        assert!(is_mount_point(Path::new("/proc")));
        assert!(!is_mount_point(Path::new("/proc/self")));
    }
}
