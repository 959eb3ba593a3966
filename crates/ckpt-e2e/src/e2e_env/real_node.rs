//! A real node for the end-to-end tests: the release's kubelet with its runtime (v1.20.2 with
//! Debian's containerd 1.6 and runc; v1.37.2 with containerd 2 and runc 1.5 from their Go
//! modules, see [`NodeRuntime`]) running real containers, registered as `node-1` with a
//! control plane started by
//! [`StartOptions::real_node`](crate::e2e_env::StartOptions::real_node) (see reference/real-node).
//!
//! The node lives in namespaces the project creates, so it writes nothing of the machine's:
//!
//! - network: the plane's [`NodeNetwork`] (a veth pair, no default route);
//! - mount: a private, persistent mount namespace (pinned at `<node dir>/ns/mnt`) in which
//!   private directories are mounted on the node's default paths and plain files over the
//!   `/proc/sys` entries the kubelet would set (see [`layout`]).
//!
//! containerd and the kubelet run inside both, as children of this process (`nsenter` execs
//! them). A [`reboot`](RealNode::reboot) is a power cut: every process of the node is
//! SIGKILLed (found from its namespaces, never by name), the mount namespace and `/run` are
//! dropped, the disk is kept, and containerd and the kubelet start again. [`stop`](RealNode::stop)
//! is the same cut without the restart, plus the namespace pins; the plane removes the network
//! and the work dir when it stops (and stops a node it finds in its work dir first).
//!
//! On a plane started with [`StartOptions::real_nodes`](crate::e2e_env::StartOptions::real_nodes)
//! each node of its [`Lan`](super::lan::Lan) is one such node ([`RealNode::boot_on_lan`]),
//! `node-N` in `<plane work dir>/node-N`, which also runs a member of the LAN's etcd as a host
//! process (its data on the node's disk; a power cut kills it, the node's boot starts it
//! again, as systemd would); [`stop_in`] stops them all.
//!
//! The images the node runs are imported into containerd: the pause image and a busybox
//! ([`PAUSE_IMAGE`], [`BUSYBOX_IMAGE`]), plus any archives in [`RealNodeOptions::images`].

mod config;
mod images;
mod layout;
mod processes;

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;

pub use self::config::{KUBELET_PORT, KUBELET_READ_ONLY_PORT};
pub use self::images::{BUSYBOX_IMAGE, PAUSE_IMAGE};
pub use self::layout::{CNI_CONF_DIR, CONTAINERD_SOCKET, MANIFESTS_DIR};
use self::layout::{DISK_MOUNTS, KUBELET_SYSCTLS, Layout, OVERLAID_TREES, RUN};
use self::processes::{
    NodeNamespaces, cgroup_hierarchies, container_cgroups, kill_all, node_processes, pinned_inode,
    remove_cgroups, wait_gone,
};
use super::build::{BinDir, NodeRuntime};
use super::control_plane::{ControlPlane, NODE_NAME, PROGRESS, node_name};
use super::curl::{http_probe, http_status, node_ready_probe};
use super::lan::ETCD_PEER_PORT;
use super::node_network::{NodeNetwork, is_mount_point};
use super::state::parse_state;
use crate::command::{command_line, run_command};
use crate::process::{Managed, in_path, installed};
use crate::progress::human_duration;
use crate::wait::{Probe, wait_ready};

/// The node's directory in the plane's work dir (a LAN's nodes have `node-N`, their names).
pub const NODE_DIR: &str = "node";

const CONTAINERD_READY_TIMEOUT: Duration = Duration::from_secs(30);
const ETCD_ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
const KUBELET_HEALTHY_TIMEOUT: Duration = Duration::from_secs(60);
/// Registration, the CNI network and the first status update take ~16 s here (the recipe).
const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(120);

/// What runs on the node besides what it always has.
#[derive(Clone, Debug)]
pub struct RealNodeOptions {
    pub bins: BinDir,
    /// Kubelet flags after the node's own (for a repeated flag the later one wins).
    pub extra_kubelet_args: Vec<String>,
    /// OCI or Docker image archives imported into containerd's `k8s.io` namespace at start
    /// (e.g. the agent's image).
    pub images: Vec<PathBuf>,
    /// How long [`RealNode::start`] waits for the Node to be Ready.
    pub ready_timeout: Duration,
}

impl RealNodeOptions {
    pub fn new(bins: BinDir) -> RealNodeOptions {
        RealNodeOptions {
            bins,
            extra_kubelet_args: Vec::new(),
            images: Vec::new(),
            ready_timeout: DEFAULT_READY_TIMEOUT,
        }
    }
}

/// How a node runs its etcd member.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct EtcdMember {
    bin: PathBuf,
    args: Vec<String>,
}

/// A running (or partly started) real node. Dropping it stops it (see [`RealNode::stop`]),
/// unless it was [`detach`](RealNode::detach)ed or [`attach`](RealNode::attach)ed.
pub struct RealNode {
    /// The Node's name: `node-1`, or a LAN's `node-N`.
    name: String,
    layout: Layout,
    network: NodeNetwork,
    kubelet_bin: PathBuf,
    kubelet_args: Vec<String>,
    runtime: NodeRuntime,
    containerd: Option<Managed>,
    kubelet: Option<Managed>,
    /// The node's etcd member (a LAN's nodes), started with containerd at each boot.
    etcd_member: Option<EtcdMember>,
    etcd: Option<Managed>,
    namespaces: NodeNamespaces,
    /// The machine's values of [`KUBELET_SYSCTLS`] before the node started.
    host_sysctls: Vec<(String, String)>,
    stop_on_drop: bool,
    stopped: bool,
}

impl RealNode {
    /// Starts containerd and the kubelet on the plane's node network, imports the images and
    /// waits until the Node is Ready. On failure everything started so far is stopped.
    pub fn start(plane: &ControlPlane, options: &RealNodeOptions) -> anyhow::Result<RealNode> {
        let network = plane.node_network().cloned().context(
            "the control plane has no node network: start it with StartOptions::real_node (`e2e-env start --real-node`)",
        )?;
        let started = Instant::now();
        let mut node = RealNode::boot(plane, options, NODE_NAME, NODE_DIR, network, None)?;
        let ready_after = node.wait_ready(plane, options.ready_timeout)?;
        PROGRESS.say(&format!(
            "real node {NODE_NAME} Ready after {} (start total {}); static pods: {}",
            human_duration(ready_after),
            human_duration(started.elapsed()),
            node.manifests_dir().display()
        ));
        Ok(node)
    }

    /// Boots node number `index` (from 1) of the plane's LAN, `node-N` in `<work dir>/node-N`:
    /// containerd, its etcd member and the kubelet, without waiting for the API server (the
    /// plane starts it on the members once they all run: see
    /// [`ControlPlane::start_on_lan`]); [`wait_ready`](RealNode::wait_ready) then waits for
    /// the Node. On failure everything started so far is stopped.
    pub fn boot_on_lan(
        plane: &ControlPlane,
        options: &RealNodeOptions,
        index: usize,
    ) -> anyhow::Result<RealNode> {
        let lan = plane.lan().context(
            "the control plane has no LAN: start it with StartOptions::real_nodes (`e2e-env start --real-nodes N`)",
        )?;
        let network = index
            .checked_sub(1)
            .and_then(|i| lan.nodes.get(i))
            .cloned()
            .with_context(|| format!("the LAN has no node {index}: it has {}", lan.nodes.len()))?;
        let name = node_name(index);
        let etcd = EtcdMember {
            bin: options.bins.etcd().to_owned(),
            args: lan.etcd_member_args(index, &plane.workdir().join(&name).join("disk/etcd"))?,
        };
        RealNode::boot(plane, options, &name, &name, network, Some(etcd))
    }

    /// Everything of a start but the wait for the Node to be Ready.
    fn boot(
        plane: &ControlPlane,
        options: &RealNodeOptions,
        name: &str,
        dir: &str,
        network: NodeNetwork,
        etcd_member: Option<EtcdMember>,
    ) -> anyhow::Result<RealNode> {
        preflight(options)?;
        // From here on, a plane that stops first stops this node before itself.
        plane.stop_first(stop_in);
        let layout = Layout::new(&plane.workdir().join(dir));
        anyhow::ensure!(
            !layout.dir().exists(),
            "{} exists: a real node ran in this work dir",
            layout.dir().display()
        );
        let mut kubelet_args = config::kubelet_args(
            options.bins.release(),
            name,
            &network,
            &plane.kubeconfig_of_node(name),
        );
        kubelet_args.extend(options.extra_kubelet_args.iter().cloned());
        let mut node = RealNode {
            name: name.to_owned(),
            layout,
            network,
            kubelet_bin: options.bins.kubelet(),
            kubelet_args,
            runtime: options.bins.runtime().clone(),
            containerd: None,
            kubelet: None,
            etcd_member,
            etcd: None,
            namespaces: NodeNamespaces::default(),
            host_sysctls: read_host_sysctls(),
            stop_on_drop: true,
            stopped: false,
        };
        // From here on, Drop cleans up whatever fails.
        node.prepare_disk()?;
        node.namespaces.net = pinned_inode(&node.network.netns_path());
        node.write_state()?;
        node.start_runtime()?;
        let imported = Instant::now();
        let mut archives = images::write_builtin(&node.layout.images_dir(), &options.bins.pause())?;
        archives.extend(options.images.iter().cloned());
        for archive in &archives {
            images::import(&node.runtime.ctr(), &node.containerd_socket(), archive)?;
        }
        PROGRESS.say(&format!(
            "imported {} image archive(s) into containerd (k8s.io) in {}",
            archives.len(),
            human_duration(imported.elapsed())
        ));
        node.start_kubelet()?;
        Ok(node)
    }

    /// The node that `start` left running in the plane's work dir, if any. Dropping it stops
    /// nothing; [`stop`](RealNode::stop) and [`reboot`](RealNode::reboot) work.
    pub fn attach(plane_workdir: &Path) -> anyhow::Result<Option<RealNode>> {
        RealNode::attach_named(plane_workdir, NODE_DIR)
    }

    /// The node `name` (`node-N`) that `boot_on_lan` left running in the plane's work dir,
    /// if any; like [`attach`](RealNode::attach).
    pub fn attach_on_lan(plane_workdir: &Path, name: &str) -> anyhow::Result<Option<RealNode>> {
        RealNode::attach_named(plane_workdir, name)
    }

    fn attach_named(plane_workdir: &Path, dir: &str) -> anyhow::Result<Option<RealNode>> {
        let layout = Layout::new(&plane_workdir.join(dir));
        let Ok(text) = fs::read_to_string(layout.state_file()) else {
            return Ok(None);
        };
        let state = parse_state(&text);
        let get = |key: &str| {
            state
                .get(key)
                .with_context(|| format!("{} has no {key}", layout.state_file().display()))
        };
        let network: NodeNetwork =
            serde_json::from_str(get("NODE_NETWORK")?).context("bad NODE_NETWORK in the node's state")?;
        let kubelet_args: Vec<String> =
            serde_json::from_str(get("KUBELET_ARGS")?).context("bad KUBELET_ARGS in the node's state")?;
        let runtime: NodeRuntime =
            serde_json::from_str(get("RUNTIME")?).context("bad RUNTIME in the node's state")?;
        let owner = layout.dir().to_owned();
        let attach = |name: &'static str| {
            let pid = fs::read_to_string(layout.pid_file(name))
                .ok()?
                .trim()
                .parse()
                .ok()?;
            Some(Managed::attach(name, pid, &layout.log(name), &owner))
        };
        let host_sysctls = serde_json::from_str(get("HOST_SYSCTLS")?).unwrap_or_default();
        // From the pins only: a recorded inode of a namespace that is gone may be another
        // namespace's by now.
        let namespaces = NodeNamespaces {
            mnt: pinned_inode(&layout.mnt_ns_pin()),
            net: pinned_inode(&network.netns_path()),
        };
        let name = state
            .get("NODE_NAME")
            .cloned()
            .unwrap_or_else(|| NODE_NAME.to_owned());
        let etcd_member = match state.get("ETCD_MEMBER").filter(|json| !json.is_empty()) {
            Some(json) => Some(serde_json::from_str(json).context("bad ETCD_MEMBER in the node's state")?),
            None => None,
        };
        Ok(Some(RealNode {
            name,
            containerd: attach("containerd"),
            kubelet: attach("kubelet"),
            etcd: attach("etcd"),
            etcd_member,
            layout: layout.clone(),
            network,
            kubelet_bin: PathBuf::from(get("KUBELET_BIN")?),
            kubelet_args,
            runtime,
            namespaces,
            host_sysctls,
            stop_on_drop: false,
            stopped: false,
        }))
    }

    /// Leaves the node running when this value is dropped (`cargo xtask e2e-env start`).
    pub fn detach(mut self) {
        self.stop_on_drop = false;
    }

    /// Cuts the power: SIGKILLs every process of the node (kubelet, containerd, shims,
    /// containers), drops its mount namespace and `/run` and the containers' cgroups, keeps its
    /// disk and network, then starts containerd and the kubelet again. Returns once the
    /// kubelet answers on its read-only port (the API server may be down); returns the time
    /// from the cut until then.
    pub fn reboot(&mut self) -> anyhow::Result<Duration> {
        let started = Instant::now();
        self.cut_power()?;
        self.power_on()?;
        let took = started.elapsed();
        PROGRESS.say(&format!(
            "real node {} rebooted: its daemons up {} after the power cut",
            self.name,
            human_duration(took)
        ));
        Ok(took)
    }

    /// The first half of a [`reboot`](RealNode::reboot): the power cut alone (several nodes
    /// cut at once are each cut first, then each powered on). Returns how many processes
    /// were killed.
    pub fn cut_power(&mut self) -> anyhow::Result<usize> {
        let killed = self.power_off()?;
        PROGRESS.say(&format!(
            "real node {} powered off: {killed} process(es) killed, runtime state dropped",
            self.name
        ));
        Ok(killed)
    }

    /// The second half of a [`reboot`](RealNode::reboot): containerd, the etcd member if the
    /// node has one, and the kubelet, started again; returns once the kubelet answers.
    pub fn power_on(&mut self) -> anyhow::Result<()> {
        self.start_runtime()?;
        self.start_kubelet()
    }

    /// Points the kubelet at another API server (another kubeconfig) from its next start on,
    /// reboots included; [`restart_kubelet`](RealNode::restart_kubelet) applies it now.
    pub fn set_kubeconfig(&mut self, kubeconfig: &Path) -> anyhow::Result<()> {
        let flag = format!("--kubeconfig={}", kubeconfig.display());
        let arg = self
            .kubelet_args
            .iter_mut()
            .find(|arg| arg.starts_with("--kubeconfig="))
            .context("the kubelet has no --kubeconfig")?;
        *arg = flag;
        self.write_state()
    }

    /// Stops only the kubelet (SIGTERM) and starts it again: the containers keep running.
    /// Returns once it answers `/healthz`.
    pub fn restart_kubelet(&mut self) -> anyhow::Result<()> {
        if let Some(kubelet) = &mut self.kubelet {
            kubelet.terminate("TERM", Duration::from_secs(10))?;
        }
        self.kubelet = None;
        self.start_kubelet()
    }

    /// Stops the node like [`reboot`](RealNode::reboot)'s power cut, then unpins its mount
    /// namespace. The files stay (the plane removes its work dir).
    pub fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown()
    }

    /// Waits until the API server reports the Node Ready; returns how long that took.
    pub fn wait_ready(&mut self, plane: &ControlPlane, timeout: Duration) -> anyhow::Result<Duration> {
        let name = &self.name;
        let node_path = format!("/api/v1/nodes/{name}");
        let log = self.layout.log("kubelet");
        let kubelet = self.kubelet.as_mut().context("the kubelet is not running")?;
        let ((), took) = wait_ready(&format!("Node {name} Ready"), timeout, &log, || {
            kubelet.ensure_running("the real node did not become Ready")?;
            Ok(node_ready_probe(plane.api_get(&node_path)?))
        })?;
        Ok(took)
    }

    /// The Node's name: `node-1`, or a LAN's `node-N`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's directory (`<plane work dir>/node`, or a LAN's `<plane work dir>/node-N`).
    pub fn dir(&self) -> &Path {
        self.layout.dir()
    }

    pub fn network(&self) -> &NodeNetwork {
        &self.network
    }

    /// Where a path of the node (under its disk dirs or `/run`) is on the host, e.g.
    /// `/etc/kubernetes/manifests` → `<node dir>/disk/etc-kubernetes/manifests`.
    pub fn host_path(&self, node_path: impl AsRef<Path>) -> Option<PathBuf> {
        self.layout.host_path(node_path.as_ref())
    }

    /// The kubelet's static pod dir ([`MANIFESTS_DIR`] on the node) on the host. Write
    /// manifests under a dot-name first and rename them in: the kubelet skips dot files.
    pub fn manifests_dir(&self) -> PathBuf {
        self.layout.disk_dir("etc-kubernetes").join("manifests")
    }

    /// containerd's socket ([`CONTAINERD_SOCKET`] on the node) on the host: its CRI and `ctr`.
    pub fn containerd_socket(&self) -> PathBuf {
        self.layout.run_dir().join("containerd/containerd.sock")
    }

    pub fn kubelet_log(&self) -> PathBuf {
        self.layout.log("kubelet")
    }

    pub fn containerd_log(&self) -> PathBuf {
        self.layout.log("containerd")
    }

    /// The node's address (its end of the veth pair): where its host-network pods listen.
    pub fn ip(&self) -> std::net::Ipv4Addr {
        self.network.node_ip
    }

    /// The kubelet's API (HTTPS, self-signed) on the node's address.
    pub fn kubelet_url(&self) -> String {
        format!("https://{}:{KUBELET_PORT}", self.network.node_ip)
    }

    /// The kubelet's read-only API (plain HTTP, `/pods`, `/healthz`).
    pub fn kubelet_read_only_url(&self) -> String {
        format!("http://{}:{KUBELET_READ_ONLY_PORT}", self.network.node_ip)
    }

    pub fn kubelet_pid(&self) -> Option<u32> {
        self.kubelet.as_ref().map(Managed::pid)
    }

    pub fn containerd_pid(&self) -> Option<u32> {
        self.containerd.as_ref().map(Managed::pid)
    }

    /// The node's etcd member's pid (a LAN's nodes have one).
    pub fn etcd_pid(&self) -> Option<u32> {
        self.etcd.as_ref().map(Managed::pid)
    }

    /// The node's etcd member's log, if it has one.
    pub fn etcd_log(&self) -> Option<PathBuf> {
        self.etcd_member.as_ref().map(|_| self.layout.log("etcd"))
    }

    /// Every live process of the node: kubelet, containerd, shims, containers, helpers.
    pub fn processes(&self) -> BTreeSet<u32> {
        node_processes(self.namespaces, &self.daemon_pids())
    }

    /// A command that runs `program` inside the node (its network and mount namespaces, as
    /// root): what an operator logged into the node would run.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--net={}", self.network.netns_path().display()))
            .arg(format!("--mount={}", self.layout.mnt_ns_pin().display()))
            .arg("--")
            .arg(program)
            .current_dir("/");
        command
    }

    /// Runs `args` inside the node; returns its stdout, or fails with its stderr.
    pub fn exec(&self, args: &[&str]) -> anyhow::Result<String> {
        let (program, rest) = args.split_first().context("exec needs a program")?;
        let mut command = self.command(program);
        command.args(rest);
        run_command(&mut command)
    }

    /// `ctr --namespace k8s.io ARGS…` against the node's containerd.
    pub fn ctr(&self, args: &[&str]) -> anyhow::Result<String> {
        run_command(
            Command::new(self.runtime.ctr())
                .arg("--address")
                .arg(self.containerd_socket())
                .args(["--namespace", "k8s.io"])
                .args(args),
        )
    }

    /// Imports an image archive (OCI or Docker) into containerd's `k8s.io` namespace; it
    /// stays on the node's disk across reboots.
    pub fn import_image(&self, archive: &Path) -> anyhow::Result<()> {
        images::import(&self.runtime.ctr(), &self.containerd_socket(), archive)
    }

    /// What the node has made on the machine right now, to check later that nothing of it
    /// survives [`stop`](RealNode::stop) and the plane's stop ([`NodeFootprint::survivors`]).
    pub fn footprint(&self) -> NodeFootprint {
        let pids = self.processes();
        let cgroups = container_cgroups(&pids);
        NodeFootprint {
            pids,
            node_dir: self.layout.dir().to_owned(),
            network: self.network.clone(),
            host_sysctls: self.host_sysctls.clone(),
            cgroups,
        }
    }

    /// What `cargo xtask e2e-env start --real-node` prints after the plane's lines.
    pub fn env_vars(&self) -> Vec<(&'static str, String)> {
        let path = |p: &Path| p.display().to_string();
        let pid = |pid: Option<u32>| pid.map(|p| p.to_string()).unwrap_or_default();
        vec![
            ("REAL_NODE_DIR", path(self.layout.dir())),
            ("REAL_NODE_NETNS", self.network.netns.clone()),
            ("REAL_NODE_MNT_NS", path(&self.layout.mnt_ns_pin())),
            ("REAL_NODE_IP", self.network.node_ip.to_string()),
            ("REAL_NODE_HOST_IP", self.network.host_ip.to_string()),
            ("REAL_NODE_POD_CIDR", self.network.pod_cidr_text()),
            ("REAL_NODE_MANIFESTS_DIR", path(&self.manifests_dir())),
            ("REAL_NODE_CONTAINERD_SOCKET", path(&self.containerd_socket())),
            ("REAL_NODE_KUBELET_URL", self.kubelet_url()),
            ("REAL_NODE_KUBELET_READ_ONLY_URL", self.kubelet_read_only_url()),
            ("REAL_NODE_KUBELET_PID", pid(self.kubelet_pid())),
            ("REAL_NODE_CONTAINERD_PID", pid(self.containerd_pid())),
            ("REAL_NODE_PAUSE_IMAGE", PAUSE_IMAGE.into()),
            ("REAL_NODE_BUSYBOX_IMAGE", BUSYBOX_IMAGE.into()),
        ]
    }

    fn daemon_pids(&self) -> Vec<u32> {
        [&self.kubelet, &self.containerd, &self.etcd]
            .into_iter()
            .flatten()
            .filter_map(Managed::live_pid)
            .collect()
    }

    /// The node's disk and `/run` dirs, its containerd and CNI configuration, the sysctl files.
    fn prepare_disk(&self) -> anyhow::Result<()> {
        let layout = &self.layout;
        let mut dirs = vec![layout.run_dir(), layout.ns_dir(), self.manifests_dir()];
        dirs.extend(DISK_MOUNTS.iter().map(|(name, _)| layout.disk_dir(name)));
        for (name, _) in OVERLAID_TREES {
            dirs.push(layout.overlay_upper(name));
            dirs.push(layout.overlay_work(name));
        }
        for dir in &dirs {
            fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        write(
            &layout.containerd_config(),
            &config::containerd_toml(&self.runtime),
        )?;
        write(
            &layout.disk_dir("etc-cni-net.d").join(config::CNI_CONFLIST),
            &config::cni_conflist(&self.network),
        )?;
        for (key, value) in KUBELET_SYSCTLS {
            let file = layout.sysctl_file(key);
            if let Some(parent) = file.parent() {
                fs::create_dir_all(parent)?;
            }
            write(&file, &format!("{value}\n"))?;
        }
        Ok(())
    }

    /// A fresh mount namespace with the node's mounts, then containerd in it; waits until
    /// containerd answers.
    fn start_runtime(&mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        self.create_mount_namespace()?;
        self.write_state()?;
        let mut command = self.command(self.runtime.containerd());
        command.arg("--config").arg(self.layout.containerd_config());
        // containerd finds its shim on PATH; a built runtime's dirs come first.
        let dirs = self.runtime.path_dirs();
        if !dirs.is_empty() {
            let path = std::env::var_os("PATH").unwrap_or_default();
            let paths = dirs.into_iter().chain(std::env::split_paths(&path));
            command.env("PATH", std::env::join_paths(paths)?);
        }
        let containerd = Managed::spawn(
            "containerd",
            &mut command,
            &self.layout.log("containerd"),
            self.layout.dir(),
        )?;
        write(
            &self.layout.pid_file("containerd"),
            &format!("{}\n", containerd.pid()),
        )?;
        let containerd = self.containerd.insert(containerd);
        let socket = self.layout.run_dir().join("containerd/containerd.sock");
        let log = containerd.log().to_owned();
        let ctr = self.runtime.ctr();
        wait_ready(
            "containerd to answer on its socket",
            CONTAINERD_READY_TIMEOUT,
            &log,
            || {
                containerd.ensure_running("containerd did not start")?;
                if !socket.exists() {
                    return Ok(Probe::Waiting("no socket yet".into()));
                }
                let mut version = Command::new(&ctr);
                version.arg("--address").arg(&socket).arg("version");
                Ok(match run_command(&mut version) {
                    Ok(_) => Probe::Ready(()),
                    Err(e) => Probe::Waiting(format!("{e:#}")),
                })
            },
        )?;
        self.write_state()?;
        PROGRESS.say(&format!(
            "containerd ready in the node's namespaces after {}",
            human_duration(started.elapsed())
        ));
        self.start_etcd()
    }

    /// The node's etcd member, if it has one; waits until it answers on its peer port. Its
    /// client port answers only once a quorum of members runs, which a node's boot cannot
    /// wait for: the other nodes may boot after it.
    fn start_etcd(&mut self) -> anyhow::Result<()> {
        let Some(member) = &self.etcd_member else {
            return Ok(());
        };
        let started = Instant::now();
        let mut command = self.command(&member.bin);
        command.args(&member.args);
        let etcd = Managed::spawn("etcd", &mut command, &self.layout.log("etcd"), self.layout.dir())?;
        write(&self.layout.pid_file("etcd"), &format!("{}\n", etcd.pid()))?;
        let netns = self.network.netns_path();
        let peer = format!("http://{}:{ETCD_PEER_PORT}/version", self.network.node_ip);
        let etcd = self.etcd.insert(etcd);
        let log = etcd.log().to_owned();
        wait_ready(
            "the etcd member to answer on its peer port",
            ETCD_ANSWER_TIMEOUT,
            &log,
            || {
                etcd.ensure_running("the node's etcd member did not start")?;
                Ok(match http_status(Some(&netns), &peer, &[]) {
                    0 => Probe::Waiting("no answer yet".into()),
                    _ => Probe::Ready(()),
                })
            },
        )?;
        self.write_state()?;
        PROGRESS.say(&format!(
            "etcd member of {} answering after {}",
            self.name,
            human_duration(started.elapsed())
        ));
        Ok(())
    }

    /// The kubelet in the node's namespaces; waits until it answers `/healthz`.
    fn start_kubelet(&mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        let mut command = self.command(&self.kubelet_bin);
        command.args(&self.kubelet_args);
        let kubelet = Managed::spawn(
            "kubelet",
            &mut command,
            &self.layout.log("kubelet"),
            self.layout.dir(),
        )?;
        write(&self.layout.pid_file("kubelet"), &format!("{}\n", kubelet.pid()))?;
        let healthz = format!("{}/healthz", self.kubelet_read_only_url());
        // From the node's own namespace: on a LAN the machine's has no route to it.
        let netns = self.network.netns_path();
        let kubelet = self.kubelet.insert(kubelet);
        let log = kubelet.log().to_owned();
        wait_ready(
            "the kubelet's /healthz 200",
            KUBELET_HEALTHY_TIMEOUT,
            &log,
            || {
                kubelet.ensure_running("the kubelet did not start")?;
                Ok(http_probe(http_status(Some(&netns), &healthz, &[])))
            },
        )?;
        self.write_state()?;
        PROGRESS.say(&format!(
            "kubelet of {} healthy on {} after {}",
            self.name,
            self.network.node_ip,
            human_duration(started.elapsed())
        ));
        Ok(())
    }

    /// Creates and pins the node's mount namespace and mounts, inside it, the overlays, the
    /// node's `/run`, its disk dirs and the sysctl files (see [`layout`]).
    fn create_mount_namespace(&mut self) -> anyhow::Result<()> {
        let ns_dir = self.layout.ns_dir();
        if !is_mount_point(&ns_dir) {
            // A mount namespace can only be pinned on a mount with private propagation.
            mount(&["--bind", &path_str(&ns_dir), &path_str(&ns_dir)])?;
            mount(&["--make-private", &path_str(&ns_dir)])?;
        }
        let pin = self.layout.mnt_ns_pin();
        write(&pin, "")?;
        run_command(
            Command::new("unshare")
                .arg(format!("--mount={}", pin.display()))
                .args(["--propagation", "private", "true"]),
        )
        .context("cannot create the node's mount namespace")?;
        self.namespaces.mnt = pinned_inode(&pin);
        anyhow::ensure!(
            self.namespaces.mnt.is_some(),
            "unshare did not pin a mount namespace at {}",
            pin.display()
        );

        for (name, tree) in OVERLAID_TREES {
            let options = format!(
                "lowerdir={tree},upperdir={},workdir={}",
                self.layout.overlay_upper(name).display(),
                self.layout.overlay_work(name).display()
            );
            self.in_mount_namespace(&[
                "mount",
                "-t",
                "overlay",
                "pod-checkpointer-node",
                "-o",
                &options,
                tree,
            ])?;
        }
        self.in_mount_namespace(&["mount", "--bind", &path_str(&self.layout.run_dir()), RUN])?;
        for (name, target) in DISK_MOUNTS {
            self.in_mount_namespace(&["mkdir", "-p", target])?;
            self.in_mount_namespace(&["mount", "--bind", &path_str(&self.layout.disk_dir(name)), target])?;
        }
        for (key, _) in KUBELET_SYSCTLS {
            let target = format!("/proc/sys/{key}");
            self.in_mount_namespace(&[
                "mount",
                "--bind",
                &path_str(&self.layout.sysctl_file(key)),
                &target,
            ])?;
        }
        Ok(())
    }

    fn in_mount_namespace(&self, args: &[&str]) -> anyhow::Result<()> {
        run_command(
            Command::new("nsenter")
                .arg(format!("--mount={}", self.layout.mnt_ns_pin().display()))
                .arg("--")
                .args(args),
        )
        .map(drop)
        .context("cannot set up the node's mount namespace")
    }

    /// The power cut: kills every process of the node, reaps the daemons, unpins the mount
    /// namespace, wipes `/run` and removes the containers' cgroups; returns how many
    /// processes were killed.
    fn power_off(&mut self) -> anyhow::Result<usize> {
        let victims = self.processes();
        let cgroups = kill_all(self.namespaces, &self.daemon_pids())?;
        for daemon in [&mut self.kubelet, &mut self.containerd, &mut self.etcd]
            .into_iter()
            .flatten()
        {
            daemon.terminate("KILL", Duration::from_secs(5))?;
        }
        let victims: Vec<u32> = victims.into_iter().collect();
        anyhow::ensure!(
            wait_gone(&victims, Duration::from_secs(10)),
            "node processes still alive after SIGKILL"
        );
        self.kubelet = None;
        self.containerd = None;
        self.etcd = None;
        for name in ["kubelet", "containerd", "etcd"] {
            let _ = fs::remove_file(self.layout.pid_file(name));
        }
        let pin = self.layout.mnt_ns_pin();
        if is_mount_point(&pin) {
            mount_command("umount", &[&path_str(&pin)])?;
        }
        let _ = fs::remove_file(&pin);
        self.namespaces.mnt = None;
        let run = self.layout.run_dir();
        if run.exists() {
            fs::remove_dir_all(&run).with_context(|| format!("cannot wipe {}", run.display()))?;
        }
        fs::create_dir_all(&run)?;
        let left = remove_cgroups(&cgroups);
        if !left.is_empty() {
            PROGRESS.say(&format!("cgroups left behind: {left:?}"));
        }
        self.write_state()?;
        Ok(victims.len())
    }

    fn shutdown(&mut self) -> anyhow::Result<()> {
        self.stopped = true;
        self.power_off()?;
        let ns_dir = self.layout.ns_dir();
        if is_mount_point(&ns_dir) {
            mount_command("umount", &[&path_str(&ns_dir)])?;
        }
        let _ = fs::remove_dir(&ns_dir);
        match fs::remove_file(self.layout.state_file()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("cannot remove {}", self.layout.state_file().display()))
            }
            _ => Ok(()),
        }
    }

    fn write_state(&self) -> anyhow::Result<()> {
        let lines = [
            ("NODE_NAME", self.name.clone()),
            (
                "ETCD_MEMBER",
                match &self.etcd_member {
                    Some(member) => serde_json::to_string(member)?,
                    None => String::new(),
                },
            ),
            ("NODE_DIR", path_str(self.layout.dir())),
            ("NODE_NETWORK", serde_json::to_string(&self.network)?),
            ("KUBELET_BIN", path_str(&self.kubelet_bin)),
            ("KUBELET_ARGS", serde_json::to_string(&self.kubelet_args)?),
            ("RUNTIME", serde_json::to_string(&self.runtime)?),
            ("HOST_SYSCTLS", serde_json::to_string(&self.host_sysctls)?),
        ];
        let text: String = lines.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
        write(&self.layout.state_file(), &text)
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        if self.stop_on_drop
            && !self.stopped
            && let Err(e) = self.shutdown()
        {
            PROGRESS.say(&format!("real node cleanup failed: {e:#}"));
        }
    }
}

/// Stops the real nodes in a plane's work dir (the single node, a LAN's `node-N`), if any run
/// there: what the plane runs first when it stops ([`ControlPlane::stop_first`]). Tries every
/// node; the error names each that failed.
pub fn stop_in(plane_workdir: &Path) -> anyhow::Result<()> {
    let mut dirs = vec![NODE_DIR.to_owned()];
    if let Ok(entries) = fs::read_dir(plane_workdir) {
        let mut lan_dirs: Vec<String> = entries
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .filter(|name| {
                name.strip_prefix("node-")
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            })
            .collect();
        lan_dirs.sort();
        dirs.extend(lan_dirs);
    }
    let mut errors = Vec::new();
    for dir in dirs {
        let stopped =
            RealNode::attach_named(plane_workdir, &dir).and_then(|node| node.map_or(Ok(()), RealNode::stop));
        if let Err(e) = stopped {
            errors.push(format!("{dir}: {e:#}"));
        }
    }
    anyhow::ensure!(
        errors.is_empty(),
        "cannot stop the real nodes: {}",
        errors.join("; ")
    );
    Ok(())
}

/// What a node had made on the machine at one moment (see [`RealNode::footprint`]).
#[derive(Clone, Debug)]
pub struct NodeFootprint {
    pids: BTreeSet<u32>,
    node_dir: PathBuf,
    network: NodeNetwork,
    host_sysctls: Vec<(String, String)>,
    cgroups: BTreeSet<String>,
}

impl NodeFootprint {
    /// How many processes the node had.
    pub fn process_count(&self) -> usize {
        self.pids.len()
    }

    /// What of it is still there: processes (recorded, or started for it), mounts under
    /// its dir or of its network namespace, the namespace, the veth, the host route, the
    /// containers' cgroups, shim sockets in the machine's `/run/containerd`, and changed
    /// machine sysctls. Empty once the node and its plane are stopped.
    pub fn survivors(&self) -> Vec<String> {
        let mut left = Vec::new();
        let alive: Vec<u32> = self
            .pids
            .iter()
            .copied()
            .filter(|pid| crate::process::is_alive(*pid))
            .collect();
        if !alive.is_empty() {
            left.push(format!("processes {alive:?}"));
        }
        // Not by namespace: a freed namespace's inode number is soon another one's.
        let owned = crate::process::owned_processes(&self.node_dir);
        if !owned.is_empty() {
            left.push(format!("processes started for the node {owned:?}"));
        }
        let node_dir = path_str(&self.node_dir);
        let netns = path_str(&self.network.netns_path());
        if let Ok(mountinfo) = fs::read_to_string("/proc/self/mountinfo") {
            for line in mountinfo.lines() {
                let mount_point = line.split(' ').nth(4).unwrap_or("");
                let mount_point = super::node_network::unescape_mountinfo(mount_point);
                if mount_point.starts_with(&node_dir) || mount_point == netns {
                    left.push(format!("mount {mount_point}"));
                }
            }
        }
        if self.network.exists() {
            left.push(format!("network namespace {}", self.network.netns));
        }
        if self.network.host_link_exists() {
            left.push(format!("link {}", self.network.host_link));
        }
        let cidr = self.network.pod_cidr_text();
        match run_command(Command::new("ip").args(["route", "show", &cidr])) {
            Ok(routes) if routes.trim().is_empty() => {}
            Ok(routes) => left.push(format!("route {}", routes.trim())),
            Err(e) => left.push(format!("cannot list routes: {e:#}")),
        }
        let hierarchies = cgroup_hierarchies();
        for cgroup in &self.cgroups {
            let relative = cgroup.trim_start_matches('/');
            for dir in hierarchies
                .iter()
                .map(|h| h.join(relative))
                .filter(|d| d.is_dir())
            {
                left.push(format!("cgroup {}", dir.display()));
            }
        }
        if Path::new("/run/containerd/s").exists() {
            left.push("shim sockets in the machine's /run/containerd/s".into());
        }
        let now = read_host_sysctls();
        if now != self.host_sysctls {
            left.push(format!(
                "machine sysctls changed: {:?} -> {now:?}",
                self.host_sysctls
            ));
        }
        left
    }
}

/// The machine's values of the sysctls the kubelet would set, read from this process (which
/// is not in the node's mount namespace).
fn read_host_sysctls() -> Vec<(String, String)> {
    KUBELET_SYSCTLS
        .iter()
        .map(|(key, _)| {
            let value = fs::read_to_string(Path::new("/proc/sys").join(key)).unwrap_or_default();
            ((*key).to_owned(), value.trim().to_owned())
        })
        .collect()
}

/// Fails early: not root, missing commands or packages, missing binaries.
fn preflight(options: &RealNodeOptions) -> anyhow::Result<()> {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1));
    anyhow::ensure!(
        uid == Some("0"),
        "the real node needs root (namespaces, mounts, veth pairs)"
    );
    let runtime = options.bins.runtime();
    for command in ["nsenter", "unshare", "mount", "umount", "ip"] {
        anyhow::ensure!(
            in_path(command),
            "{command} is not installed (util-linux, mount, iproute2)"
        );
    }
    let build = match options.bins.release() {
        super::release::Release::V1_20 => "`cargo xtask e2e-env build` (it installs containerd, runc, \
                                           containernetworking-plugins and busybox-static)"
            .to_owned(),
        release => format!("`cargo xtask e2e-env build --kubernetes {}`", release.name()),
    };
    for tool in [runtime.containerd(), runtime.ctr(), runtime.runc()] {
        anyhow::ensure!(installed(&tool), "{} is missing: run {build}", tool.display());
    }
    for plugin in ["bridge", "host-local", "loopback"] {
        let path = runtime.cni_bin_dir().join(plugin);
        anyhow::ensure!(path.is_file(), "{} is missing: run {build}", path.display());
    }
    for bin in [options.bins.kubelet(), options.bins.pause()] {
        anyhow::ensure!(
            bin.is_file(),
            "{} is missing: run `cargo xtask e2e-env build`",
            bin.display()
        );
    }
    Ok(())
}

fn mount(args: &[&str]) -> anyhow::Result<()> {
    mount_command("mount", args)
}

fn mount_command(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let mut command = Command::new(program);
    command.args(args);
    run_command(&mut command)
        .map(drop)
        .with_context(|| format!("`{}`", command_line(&command)))
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

fn path_str(path: &Path) -> String {
    path.display().to_string()
}
