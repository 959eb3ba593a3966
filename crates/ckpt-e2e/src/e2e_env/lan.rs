//! The LAN of several real nodes (issue 38): a bridge inside a network namespace of its own,
//! one veth per node into it, and no interface in the machine's namespace at all.
//!
//! ```text
//! netns pod-checkpointer-lan                  netns pod-checkpointer-node-N (N = 1, 2, 3)
//!  pckpt-lan0 10.213.8.2/24 (bridge)           pckpt-node 10.213.8.1N/24, lo; NO default route
//!  the plane (etcd, kube-apiserver,            pckpt-br0 10.213.1N.1/24 (CNI bridge), pod veths
//!   controllers), test clients (kubectl, curl) route 10.213.1M.0/24 via 10.213.8.1M (M ≠ N)
//!  pckpt-lan-N: bridge port  <== veth ==>      pckpt-node
//!  route 10.213.1N.0/24 via 10.213.8.1N
//! ```
//!
//! The LAN's namespace is the only place that reaches every node: the plane that the nodes
//! join runs in it (they reach it at the bridge's address, [`Lan::ip`]), and so do the test's
//! clients, by `nsenter --net` ([`Lan::command`]). Pods reach the other nodes' pods through
//! static routes (no overlay).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use super::node_network::{NETNS_RUN_DIR, NodeNetwork, Uplink, ip, link_exists, remove_empty_netns_dir};
use crate::command::in_netns;

/// The most nodes a LAN holds: their addresses are 10.213.8.11 onwards, their pods
/// 10.213.11.0/24 onwards.
pub const MAX_NODES: usize = 9;

/// A LAN node's etcd member: clients on this port (on the node's address and its loopback),
/// peers on the next one.
pub const ETCD_CLIENT_PORT: u16 = 2379;
pub const ETCD_PEER_PORT: u16 = 2380;

/// etcd's heartbeat and election timeouts (ms) on the nodes. Its defaults (100/1000) expect
/// machines of their own; here three members, three API servers and everything else share
/// 2 cores, and a member that misses a few heartbeats would start an election.
const ETCD_HEARTBEAT_MS: u32 = 250;
const ETCD_ELECTION_MS: u32 = 2500;

/// The LAN's namespace and bridge, and the networks of its nodes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lan {
    /// The namespace holding the bridge, the plane and the test clients.
    pub netns: String,
    pub bridge: String,
    /// The bridge's own address: the plane's, as the nodes reach it.
    pub ip: Ipv4Addr,
    pub prefix_len: u8,
    /// `node-1`'s network first.
    pub nodes: Vec<NodeNetwork>,
}

impl Lan {
    /// The project's LAN of `count` nodes (1 ..= [`MAX_NODES`]): node N at 10.213.8.1N, its
    /// pods in 10.213.1N.0/24, in the namespace `pod-checkpointer-node-N`.
    pub fn project(count: usize) -> anyhow::Result<Lan> {
        anyhow::ensure!(
            (1..=MAX_NODES).contains(&count),
            "a LAN holds 1 to {MAX_NODES} nodes, not {count}"
        );
        let netns = "pod-checkpointer-lan".to_owned();
        let bridge = "pckpt-lan0".to_owned();
        let ip = Ipv4Addr::new(10, 213, 8, 2);
        let prefix_len = 24;
        let index = |n: usize| u8::try_from(n).unwrap_or(u8::MAX);
        let node_ip = |n: usize| Ipv4Addr::new(10, 213, 8, 10 + index(n));
        let pod_cidr = |n: usize| Ipv4Addr::new(10, 213, 10 + index(n), 0);
        let nodes = (1..=count)
            .map(|n| NodeNetwork {
                netns: format!("pod-checkpointer-node-{n}"),
                host_link: format!("pckpt-lan-{n}"),
                node_link: "pckpt-node".into(),
                host_ip: ip,
                node_ip: node_ip(n),
                prefix_len,
                bridge: "pckpt-br0".into(),
                pod_cidr: pod_cidr(n),
                pod_prefix_len: 24,
                uplink: Uplink::Lan {
                    netns: netns.clone(),
                    bridge: bridge.clone(),
                    routes: (1..=count)
                        .filter(|&m| m != n)
                        .map(|m| (format!("{}/24", pod_cidr(m)), node_ip(m)))
                        .collect(),
                },
            })
            .collect();
        Ok(Lan {
            netns,
            bridge,
            ip,
            prefix_len,
            nodes,
        })
    }

    /// `/run/netns/<netns>`, for `nsenter --net=`.
    pub fn netns_path(&self) -> PathBuf {
        Path::new(NETNS_RUN_DIR).join(&self.netns)
    }

    /// A command that runs `program` in the LAN's namespace (the machine's mounts and
    /// processes, the LAN's network): the plane's processes and the test's clients.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        in_netns(&self.netns_path(), program)
    }

    /// `--etcd-servers` for an API server in the LAN's namespace: every node's member.
    pub fn etcd_servers(&self) -> String {
        let urls: Vec<String> = self
            .nodes
            .iter()
            .map(|node| format!("http://{}:{ETCD_CLIENT_PORT}", node.node_ip))
            .collect();
        urls.join(",")
    }

    /// The flags of node number `index`'s (from 1) etcd member `node-N`, its data in
    /// `data_dir`: one of a cluster of every node's member, created new on the first start and
    /// joined again with its data after a power cut.
    pub fn etcd_member_args(&self, index: usize, data_dir: &Path) -> anyhow::Result<Vec<String>> {
        let node = index
            .checked_sub(1)
            .and_then(|i| self.nodes.get(i))
            .with_context(|| format!("the LAN has no node {index}"))?;
        let peer = |ip: Ipv4Addr| format!("http://{ip}:{ETCD_PEER_PORT}");
        let cluster: Vec<String> = (1..)
            .zip(&self.nodes)
            .map(|(n, node)| format!("node-{n}={}", peer(node.node_ip)))
            .collect();
        let client = format!("http://{}:{ETCD_CLIENT_PORT}", node.node_ip);
        Ok(vec![
            format!("--name=node-{index}"),
            format!("--data-dir={}", data_dir.display()),
            format!("--listen-client-urls={client},http://127.0.0.1:{ETCD_CLIENT_PORT}"),
            format!("--advertise-client-urls={client}"),
            format!("--listen-peer-urls={}", peer(node.node_ip)),
            format!("--initial-advertise-peer-urls={}", peer(node.node_ip)),
            format!("--initial-cluster={}", cluster.join(",")),
            "--initial-cluster-state=new".into(),
            "--initial-cluster-token=pod-checkpointer-lan".into(),
            format!("--heartbeat-interval={ETCD_HEARTBEAT_MS}"),
            format!("--election-timeout={ETCD_ELECTION_MS}"),
        ])
    }

    /// Creates the namespace, the bridge with its address, then every node's network.
    /// Returns whether `/run/netns` had to be created. A failure undoes what was done.
    pub fn create(&self) -> anyhow::Result<bool> {
        self.preflight()?;
        let run_dir_existed = Path::new(NETNS_RUN_DIR).exists();
        let address = format!("{}/{}", self.ip, self.prefix_len);
        let netns = self.netns.as_str();
        let steps: [&[&str]; 5] = [
            &["netns", "add", netns],
            &["-n", netns, "link", "set", "lo", "up"],
            &["-n", netns, "link", "add", &self.bridge, "type", "bridge"],
            &["-n", netns, "addr", "add", &address, "dev", &self.bridge],
            &["-n", netns, "link", "set", &self.bridge, "up"],
        ];
        let created = steps
            .iter()
            .try_for_each(|step| ip(step).map(drop))
            .and_then(|()| self.nodes.iter().try_for_each(|node| node.create().map(drop)));
        if let Err(e) = created {
            let _ = self.remove(!run_dir_existed);
            return Err(e.context(format!("cannot create the LAN {}", self.netns)));
        }
        Ok(!run_dir_existed)
    }

    /// Removes every node's network, then the LAN's namespace (the bridge goes with it), then
    /// `/run/netns` when `remove_run_dir` and nothing else is pinned there. Call it once the
    /// processes in these namespaces are gone. Idempotent.
    pub fn remove(&self, remove_run_dir: bool) -> anyhow::Result<()> {
        let mut errors: Vec<String> = self
            .nodes
            .iter()
            .filter_map(|node| node.remove(false).err())
            .map(|e| format!("{e:#}"))
            .collect();
        if self.netns_path().exists()
            && let Err(e) = ip(&["netns", "del", &self.netns])
        {
            errors.push(format!("{e:#}"));
        }
        if remove_run_dir {
            remove_empty_netns_dir();
        }
        if !errors.is_empty() {
            bail!("cannot remove the LAN {}: {}", self.netns, errors.join("; "));
        }
        Ok(())
    }

    /// Whether anything of the LAN is left: its namespace or a node's.
    pub fn exists(&self) -> bool {
        self.netns_path().exists() || self.nodes.iter().any(NodeNetwork::exists)
    }

    fn preflight(&self) -> anyhow::Result<()> {
        if self.exists() {
            bail!(
                "the network namespace {} (or a node's) exists: are real nodes running (or left \
                 over)? `cargo xtask e2e-env stop --workdir …` stops them; `ip netns del NAME` \
                 removes a leftover",
                self.netns
            );
        }
        anyhow::ensure!(
            !link_exists(&self.bridge),
            "the network interface {} exists on the host: a leftover? (`ip link del {}`)",
            self.bridge,
            self.bridge
        );
        Ok(())
    }
}

/// The LAN a plane's state records (JSON), checked.
pub(crate) fn parse_lan(json: &str) -> anyhow::Result<Lan> {
    serde_json::from_str(json).context("bad LAN in the plane's state")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_nodes_get_addresses_pod_subnets_and_routes_to_each_other() {
        let lan = Lan::project(3).unwrap();
        let ips: Vec<String> = lan.nodes.iter().map(|n| n.node_ip.to_string()).collect();
        assert_eq!(ips, ["10.213.8.11", "10.213.8.12", "10.213.8.13"]);
        let cidrs: Vec<String> = lan.nodes.iter().map(NodeNetwork::pod_cidr_text).collect();
        assert_eq!(cidrs, ["10.213.11.0/24", "10.213.12.0/24", "10.213.13.0/24"]);
        let Uplink::Lan { routes, .. } = &lan.nodes[1].uplink else {
            panic!("node-2 is not on the LAN");
        };
        assert_eq!(
            routes,
            &[
                ("10.213.11.0/24".to_owned(), Ipv4Addr::new(10, 213, 8, 11)),
                ("10.213.13.0/24".to_owned(), Ipv4Addr::new(10, 213, 8, 13)),
            ]
        );
        for node in &lan.nodes {
            assert_eq!(node.host_ip, lan.ip, "the nodes reach the plane at the bridge");
            for name in [&node.host_link, &node.node_link, &node.bridge] {
                assert!(name.len() <= 15, "{name} is too long for an interface name");
            }
        }
        let json = serde_json::to_string(&lan).unwrap();
        assert_eq!(parse_lan(&json).unwrap(), lan);
    }

    #[test]
    fn each_node_runs_a_member_of_one_etcd_cluster() {
        let lan = Lan::project(3).unwrap();
        assert_eq!(
            lan.etcd_servers(),
            "http://10.213.8.11:2379,http://10.213.8.12:2379,http://10.213.8.13:2379"
        );
        let args = lan.etcd_member_args(2, Path::new("/n/etcd")).unwrap();
        for expected in [
            "--name=node-2",
            "--data-dir=/n/etcd",
            "--listen-client-urls=http://10.213.8.12:2379,http://127.0.0.1:2379",
            "--listen-peer-urls=http://10.213.8.12:2380",
            "--initial-cluster=node-1=http://10.213.8.11:2380,node-2=http://10.213.8.12:2380,node-3=http://10.213.8.13:2380",
            "--election-timeout=2500",
        ] {
            assert!(
                args.contains(&expected.to_owned()),
                "missing {expected}: {args:?}"
            );
        }
        assert!(lan.etcd_member_args(4, Path::new("/n/etcd")).is_err());
        assert!(lan.etcd_member_args(0, Path::new("/n/etcd")).is_err());
    }

    #[test]
    fn a_lan_holds_one_to_nine_nodes() {
        assert!(Lan::project(0).is_err());
        assert!(Lan::project(MAX_NODES).is_ok());
        assert!(Lan::project(MAX_NODES + 1).is_err());
    }
}
