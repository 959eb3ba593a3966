//! What a plane starts, and the checks and the work dir that come before anything starts.

use std::fs;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use super::hollow::CRI_SOCKET;
use crate::e2e_env::build::BinDir;
use crate::e2e_env::lan::Lan;
use crate::e2e_env::node_network::NodeNetwork;
use crate::process::{in_path, installed, random_hex};

/// What to start, and where.
#[derive(Clone, Debug)]
pub struct StartOptions {
    pub bins: BinDir,
    /// A fresh (missing or empty) dir; by default `$TMPDIR/ckpt-e2e.XXXXXX`.
    pub workdir: Option<PathBuf>,
    /// etcd's client port; its peer port is the next one.
    pub etcd_port: u16,
    pub apiserver_port: u16,
    /// Also start kubemark's hollow kubelet as `node-1` and wait for the Node to be Ready.
    pub hollow_node: bool,
    /// The hollow kubelet's API (plain HTTP in kubemark 1.20) on 0.0.0.0.
    pub kubelet_port: u16,
    pub kubelet_read_only_port: u16,
    /// Create this network and bind the API server to its host end instead of loopback, so
    /// the real node reaches it from its namespace (host clients use that address too).
    pub node_network: Option<NodeNetwork>,
    /// Create this LAN instead (several real nodes) and run the plane in its namespace, the
    /// API server bound to the LAN's address (clients reach it from there too, see
    /// [`ControlPlane::lan`](super::ControlPlane::lan)). Excludes `node_network` and
    /// `hollow_node`.
    pub lan: Option<Lan>,
    /// Also run kube-controller-manager and kube-scheduler (host network, admin identity),
    /// with ServiceAccount admission and bound service-account tokens on the API server.
    pub controllers: bool,
    /// kube-controller-manager's and kube-scheduler's HTTPS ports (health only) on 127.0.0.1.
    pub controller_manager_port: u16,
    pub scheduler_port: u16,
    /// Static-token identities `fleet_user(1..=n)` in `FLEET_GROUP`, audited like the
    /// agent's user: one per agent of `cargo xtask bench --fleet`.
    pub fleet_agents: usize,
}

impl StartOptions {
    /// The recipe's ports (2379/2380, 6443, 10250, 10255), a fresh temp work dir, no hollow node.
    pub fn new(bins: BinDir) -> StartOptions {
        StartOptions {
            bins,
            workdir: None,
            etcd_port: 2379,
            apiserver_port: 6443,
            hollow_node: false,
            kubelet_port: 10250,
            kubelet_read_only_port: 10255,
            node_network: None,
            lan: None,
            controllers: false,
            controller_manager_port: 20257,
            scheduler_port: 20259,
            fleet_agents: 0,
        }
    }

    /// The plane a real node (`RealNode`) joins: the project's node network, the
    /// controllers, and ports of its own (etcd 12379/12380, kube-apiserver 17443 on the veth,
    /// controller-manager 20257, scheduler 20259), so it runs beside a hollow-node plane.
    pub fn real_node(bins: BinDir) -> StartOptions {
        StartOptions {
            etcd_port: 12379,
            apiserver_port: 17443,
            node_network: Some(NodeNetwork::project()),
            controllers: true,
            ..StartOptions::new(bins)
        }
    }

    /// The plane `count` real nodes join (issue 38): [`real_node`](Self::real_node)'s, on
    /// the project's LAN ([`Lan::project`]) instead of the single node's network.
    pub fn real_nodes(bins: BinDir, count: usize) -> anyhow::Result<StartOptions> {
        Ok(StartOptions {
            node_network: None,
            lan: Some(Lan::project(count)?),
            ..StartOptions::real_node(bins)
        })
    }

    /// Where the API server listens: the LAN's address, the host end of the node network,
    /// or loopback.
    pub(super) fn bind_ip(&self) -> Ipv4Addr {
        match (&self.lan, &self.node_network) {
            (Some(lan), _) => lan.ip,
            (None, Some(network)) => network.host_ip,
            (None, None) => Ipv4Addr::LOCALHOST,
        }
    }
}

/// Fails early, before anything is started: missing commands, busy ports, a running hollow node.
pub(super) fn preflight(options: &StartOptions) -> anyhow::Result<()> {
    anyhow::ensure!(
        options.lan.is_none() || (options.node_network.is_none() && !options.hollow_node),
        "a plane on a LAN has no single node network and no hollow node"
    );
    for command in ["openssl", "curl"] {
        anyhow::ensure!(
            in_path(command),
            "{command} is not installed: run `cargo xtask e2e-env build`"
        );
    }
    // The etcd these binaries run with: built from its module beside them (v1.34 and
    // later), or Debian's on PATH (v1.20). Debian's on PATH proves nothing for the former.
    let etcd = options.bins.etcd();
    anyhow::ensure!(
        installed(etcd),
        "etcd ({}) is not installed: run `cargo xtask e2e-env build`",
        etcd.display()
    );
    anyhow::ensure!(
        options.bins.kube_apiserver().is_file(),
        "{} is missing: run `cargo xtask e2e-env build`",
        options.bins.kube_apiserver().display()
    );
    let peer_port = options
        .etcd_port
        .checked_add(1)
        .context("ETCD_PORT must be below 65535")?;
    let mut ports = vec![
        ("127.0.0.1", options.etcd_port, "etcd client", "ETCD_PORT"),
        ("127.0.0.1", peer_port, "etcd peer (ETCD_PORT + 1)", "ETCD_PORT"),
    ];
    // With a node network the API server's address only exists once the plane created it.
    if options.node_network.is_none() {
        ports.push((
            "127.0.0.1",
            options.apiserver_port,
            "kube-apiserver",
            "APISERVER_PORT",
        ));
    }
    if options.controllers {
        for (bin, what) in [
            (options.bins.kube_controller_manager(), "kube-controller-manager"),
            (options.bins.kube_scheduler(), "kube-scheduler"),
        ] {
            anyhow::ensure!(
                bin.is_file(),
                "{} ({what}) is missing: run `cargo xtask e2e-env build`",
                bin.display()
            );
        }
        ports.push((
            "127.0.0.1",
            options.controller_manager_port,
            "kube-controller-manager",
            "(StartOptions::controller_manager_port)",
        ));
        ports.push((
            "127.0.0.1",
            options.scheduler_port,
            "kube-scheduler",
            "(StartOptions::scheduler_port)",
        ));
    }
    if options.hollow_node {
        ports.push(("0.0.0.0", options.kubelet_port, "hollow kubelet", "KUBELET_PORT"));
        ports.push((
            "0.0.0.0",
            options.kubelet_read_only_port,
            "hollow kubelet read-only",
            "KUBELET_RO_PORT",
        ));
        if UnixStream::connect(CRI_SOCKET).is_ok() {
            bail!(
                "another hollow node is running: its fake CRI answers on {CRI_SOCKET} (kubemark 1.20 hard-codes \
                 that path, so only one hollow node can run per machine)"
            );
        }
    }
    // In a LAN's namespace, created fresh, every port is free.
    if options.lan.is_some() {
        ports.clear();
    }
    for (addr, port, what, env) in ports {
        if let Err(e) = TcpListener::bind((addr, port)) {
            bail!(
                "{what} port {addr}:{port} is busy ({e}): is another control plane running? Set {env} to use another port"
            );
        }
    }
    Ok(())
}

/// Creates `wanted` (which must be missing or empty), or a fresh `$TMPDIR/ckpt-e2e.XXXXXX`.
pub(super) fn create_workdir(wanted: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(dir) = wanted {
        if dir.exists() {
            let mut entries = fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))?;
            anyhow::ensure!(
                entries.next().is_none(),
                "work dir {} exists and is not empty",
                dir.display()
            );
        }
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        // Absolute, because the kubeconfigs and the state file name files in it.
        return fs::canonicalize(dir).with_context(|| format!("cannot resolve {}", dir.display()));
    }
    let tmp = std::env::temp_dir();
    for _ in 0..100 {
        let dir = tmp.join(format!("ckpt-e2e.{}", random_hex(3)?));
        match fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("cannot create {}", dir.display())),
        }
    }
    bail!("cannot find a free ckpt-e2e.* name in {}", tmp.display())
}
