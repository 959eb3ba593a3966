//! `cargo xtask e2e-env build|start|stop|apiserver|node`: the real control plane the end-to-end
//! tests run against (kube-apiserver v1.20.2 + etcd + kubemark's hollow kubelet; see
//! ARCHITECTURE.md, Testing), and the real node (kubelet + containerd + runc in namespaces of
//! its own, with kube-controller-manager and kube-scheduler; see [`real_node`]).
//!
//! The Rust API is meant for other xtask tasks and the e2e harness as well:
//! [`ensure_built`] returns the cached [`BinDir`], [`ControlPlane::start`] starts a plane that
//! stops itself when dropped, and the plane can kill, pause, resume and restart its API server.
//! [`RealNode::start`] joins a plane started with [`StartOptions::real_node`]; the node can
//! reboot, run commands inside itself and stop. The CLI prints progress on stderr and, for
//! `start`, `KEY=VALUE` lines on stdout.

// In layers, lowest first: a module imports only from those before it (the control plane
// cannot name the real node: a node has the plane stop it first, `ControlPlane::stop_first`).
// This file is their face: what the layers above use, and `cargo xtask e2e-env` on top.
pub(crate) mod build;
pub mod modules;
pub mod release;

// Small clients and records: curl, the CRI, the state files, the node network.
pub mod cri;
pub(crate) mod curl;
pub mod node_network;
pub(crate) mod state;

// Several nodes' networks on one LAN.
pub mod lan;

pub(crate) mod control_plane;

pub mod real_node;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;

pub use build::{BinDir, KUBERNETES_VERSION, cache_root, ensure_built};
use control_plane::PROGRESS;
pub use control_plane::{
    AGENT_USER, CONTROLLER_MANAGER_USER, CRI_SOCKET, ControlPlane, FLEET_GROUP, NODE_NAME, SCHEDULER_USER,
    StartOptions, fleet_user, node_name, render_kubeconfig,
};
use cri::CriClient;
pub(crate) use curl::ApiEndpoint;
pub use lan::Lan;
pub use node_network::NodeNetwork;
pub use real_node::{NodeFootprint, RealNode, RealNodeOptions};
pub use release::{RELEASE_ENV, Release};

use crate::command::run_on_terminal;
use crate::interrupt;
use crate::progress::human_duration;

/// Build, start and stop the local control plane for the end-to-end tests.
#[derive(clap::Args)]
pub struct E2eEnv {
    #[command(subcommand)]
    command: E2eEnvCommand,
}

#[derive(clap::Subcommand)]
enum E2eEnvCommand {
    /// Build the control plane's and the real node's binaries into the cache
    /// ($E2E_CACHE_DIR, default /var/cache/pod-checkpointer-e2e): for 1.37, from their Go
    /// modules (the repository's `go/`: Kubernetes v1.37.2 as one multi-call binary with
    /// the pause binary, etcd 3.6, containerd 2, runc 1.5, the CNI plugins), each cached by
    /// version, ~8.5 min cold on 2 cores; for 1.20, Kubernetes v1.20.2 from Debian's source
    /// with Debian's etcd, containerd, runc and CNI plugins, ~15 min cold; ~1 s cached.
    Build {
        #[arg(long, value_enum, default_value = "1.37")]
        kubernetes: Release,
    },
    /// Start etcd + kube-apiserver (+ hollow node, or + a real node) in a fresh work dir;
    /// prints WORKDIR=, KUBECONFIG=, STATIC_POD_DIR=, REAL_NODE_… lines on stdout.
    Start(StartArgs),
    /// Stop the processes a `start` left running in a work dir (the real node with its mounts
    /// and namespaces too) and remove the dir.
    Stop {
        #[arg(long)]
        workdir: PathBuf,
    },
    /// The real node of a running `start --real-node`: reboot it, or run a command inside it.
    Node {
        #[command(subcommand)]
        action: NodeAction,
    },
    /// Kill, pause (SIGSTOP), resume (SIGCONT) or restart the API server of a running plane.
    Apiserver {
        action: ApiserverAction,
        #[arg(long)]
        workdir: PathBuf,
    },
    /// The hollow kubelet's fake container runtime: what runs, or stop a pod like a crash.
    Cri {
        #[command(subcommand)]
        action: CriAction,
    },
}

#[derive(clap::Subcommand)]
enum CriAction {
    /// List the pod sandboxes and containers.
    Ps,
    /// StopContainer + StopPodSandbox for one pod (with restartPolicy Never it stays dead).
    Stop {
        /// NAMESPACE/NAME
        pod: String,
    },
}

#[derive(clap::Subcommand)]
enum NodeAction {
    /// Power cut and restart: kill the kubelet, containerd, shims and containers, drop the
    /// node's runtime state (not its disk), start containerd and the kubelet again.
    Reboot {
        #[arg(long)]
        workdir: PathBuf,
        /// Which of `start --real-nodes`' nodes (1, 2, …).
        #[arg(long)]
        node: Option<usize>,
    },
    /// Run a command inside the node (its network and mount namespaces), e.g.
    /// `-- ctr -n k8s.io containers ls` or `-- ip route`.
    Exec {
        #[arg(long)]
        workdir: PathBuf,
        /// Which of `start --real-nodes`' nodes (1, 2, …).
        #[arg(long)]
        node: Option<usize>,
        #[arg(required = true, last = true)]
        command: Vec<String>,
    },
}

#[derive(clap::Args)]
struct StartArgs {
    /// Also run kubemark's hollow kubelet as node-1 (needs the kubelet ports and the fixed
    /// CRI socket /tmp/kubelet_remote.sock).
    #[arg(long, conflicts_with = "real_node")]
    hollow_node: bool,
    /// Also run a real node-1: kubelet, containerd and runc in the network namespace
    /// pod-checkpointer-node (10.213.0.2, the API server on 10.213.0.1) and a private mount
    /// namespace, with kube-controller-manager and kube-scheduler. Needs root.
    #[arg(long, conflicts_with = "real_nodes")]
    real_node: bool,
    /// Run N real nodes node-1 … node-N (issue 38), each like `--real-node`'s in namespaces
    /// of its own (pod-checkpointer-node-N, 10.213.8.1N, pods 10.213.1N.0/24), joined by a
    /// bridge in the namespace pod-checkpointer-lan, where the plane runs too (the API
    /// server on 10.213.8.2): reach it with `ip netns exec pod-checkpointer-lan kubectl …`.
    #[arg(long, value_name = "N", conflicts_with = "hollow_node")]
    real_nodes: Option<usize>,
    /// Work dir to create (must be missing or empty); default $TMPDIR/ckpt-e2e.XXXXXX.
    #[arg(long)]
    workdir: Option<PathBuf>,
    /// The Kubernetes release: `1.37` and `1.34` run the Go modules' build (`build
    /// --kubernetes 1.37`): the control plane, and a real node with containerd 2 and runc
    /// 1.5; `1.20` runs Debian's source build.
    #[arg(long, value_enum, default_value = "1.37")]
    kubernetes: Release,
    /// etcd client port; the peer port is the next one [default: 2379, real node 12379].
    #[arg(long, env = "ETCD_PORT")]
    etcd_port: Option<u16>,
    /// [default: 6443, real node 17443]
    #[arg(long, env = "APISERVER_PORT")]
    apiserver_port: Option<u16>,
    /// The hollow kubelet's port [default: 10250].
    #[arg(long, env = "KUBELET_PORT")]
    kubelet_port: Option<u16>,
    /// The hollow kubelet's read-only port [default: 10255].
    #[arg(long, env = "KUBELET_RO_PORT")]
    kubelet_read_only_port: Option<u16>,
}

#[derive(clap::ValueEnum, Clone, Copy)]
enum ApiserverAction {
    /// SIGKILL: connections are refused.
    Kill,
    /// SIGSTOP: the port stays open but nothing answers (a hung API server).
    Pause,
    /// SIGCONT after a pause.
    Resume,
    /// Kill if running, start again on the same etcd, certs, tokens and port.
    Restart,
}

impl E2eEnv {
    pub fn run(&self) -> anyhow::Result<()> {
        match &self.command {
            E2eEnvCommand::Build { kubernetes } => ensure_built_release(*kubernetes).map(drop),
            E2eEnvCommand::Start(args) => {
                // Ctrl-C while starting stops what was started (the plane's and node's Drop).
                interrupt::run(PROGRESS, "everything started so far is stopped", || start(args))
            }
            E2eEnvCommand::Stop { workdir } => {
                let started = Instant::now();
                let plane = ControlPlane::attach(workdir)?;
                // A node that `start` left there, which this process did not start.
                plane.stop_first(real_node::stop_in);
                plane.stop()?;
                PROGRESS.say(&format!(
                    "stopped and removed {} in {}",
                    workdir.display(),
                    human_duration(started.elapsed())
                ));
                Ok(())
            }
            E2eEnvCommand::Apiserver { action, workdir } => {
                let mut plane = ControlPlane::attach(workdir)?;
                match action {
                    ApiserverAction::Kill => plane.kill_apiserver(),
                    ApiserverAction::Pause => plane.pause_apiserver(),
                    ApiserverAction::Resume => plane.resume_apiserver(),
                    ApiserverAction::Restart => plane.restart_apiserver().map(drop),
                }
            }
            E2eEnvCommand::Cri { action } => cri(action),
            E2eEnvCommand::Node { action } => node(action),
        }
    }
}

/// The cached binaries of `release`, without building (a hint names the build to run).
pub fn cached_bins(release: Release) -> anyhow::Result<BinDir> {
    match release {
        Release::V1_20 => BinDir::cached(),
        release => modules::cached(release),
    }
}

/// Builds `release`'s binaries unless they are cached.
pub fn ensure_built_release(release: Release) -> anyhow::Result<BinDir> {
    match release {
        Release::V1_20 => ensure_built(),
        release => modules::ensure_built(release),
    }
}

fn start(args: &StartArgs) -> anyhow::Result<()> {
    let bins = cached_bins(args.kubernetes)?;
    let defaults = match args.real_nodes {
        Some(count) => StartOptions::real_nodes(bins.clone(), count)?,
        None if args.real_node => StartOptions::real_node(bins.clone()),
        None => StartOptions::new(bins.clone()),
    };
    let options = StartOptions {
        workdir: args.workdir.clone(),
        etcd_port: args.etcd_port.unwrap_or(defaults.etcd_port),
        apiserver_port: args.apiserver_port.unwrap_or(defaults.apiserver_port),
        hollow_node: args.hollow_node,
        kubelet_port: args.kubelet_port.unwrap_or(defaults.kubelet_port),
        kubelet_read_only_port: args
            .kubelet_read_only_port
            .unwrap_or(defaults.kubelet_read_only_port),
        ..defaults
    };
    let (plane, lan_nodes) = match args.real_nodes {
        Some(count) => {
            let (plane, mut nodes) = ControlPlane::start_on_lan(&options, |plane| {
                (1..=count)
                    .map(|index| RealNode::boot_on_lan(plane, &RealNodeOptions::new(bins.clone()), index))
                    .collect::<anyhow::Result<Vec<_>>>()
            })?;
            for node in &mut nodes {
                node.wait_ready(&plane, RealNodeOptions::new(bins.clone()).ready_timeout)?;
            }
            (plane, nodes)
        }
        None => (ControlPlane::start(&options)?, Vec::new()),
    };
    let node = if args.real_node {
        Some(RealNode::start(&plane, &RealNodeOptions::new(bins.clone()))?)
    } else {
        None
    };
    for (key, value) in plane.env_vars() {
        println!("{key}={value}");
    }
    for (key, value) in node.iter().flat_map(RealNode::env_vars) {
        println!("{key}={value}");
    }
    for (index, lan_node) in (1..).zip(&lan_nodes) {
        for (key, value) in lan_node.env_vars() {
            let key = key.replacen("REAL_NODE_", &format!("REAL_NODE_{index}_"), 1);
            println!("{key}={value}");
        }
    }
    PROGRESS.say(&format!(
        "stop with: cargo xtask e2e-env stop --workdir {}",
        plane.workdir().display()
    ));
    if let Some(node) = node {
        PROGRESS.say(&format!(
            "inside the node: cargo xtask e2e-env node exec --workdir {} -- <command>, or `ip netns exec {} <command>` for its network only",
            plane.workdir().display(),
            node.network().netns
        ));
        node.detach();
    }
    if !lan_nodes.is_empty() {
        PROGRESS.say(&format!(
            "inside node N: cargo xtask e2e-env node exec --node N --workdir {} -- <command>; the API: `ip netns exec {} kubectl --kubeconfig {} …`",
            plane.workdir().display(),
            plane.lan().map(|lan| lan.netns.as_str()).unwrap_or_default(),
            plane.kubeconfig().display()
        ));
    }
    lan_nodes.into_iter().for_each(RealNode::detach);
    plane.detach();
    Ok(())
}

fn node(action: &NodeAction) -> anyhow::Result<()> {
    let (workdir, index) = match action {
        NodeAction::Reboot { workdir, node } | NodeAction::Exec { workdir, node, .. } => (workdir, node),
    };
    // The plane's own spelling of its work dir marks the node's processes as ours.
    let plane = ControlPlane::attach(workdir)?;
    let attached = match index {
        Some(index) => RealNode::attach_on_lan(plane.workdir(), &node_name(*index))?,
        None => RealNode::attach(plane.workdir())?,
    };
    let mut node = attached.with_context(|| match index {
        Some(index) => format!("no real node {} runs in {}", node_name(*index), workdir.display()),
        None => format!(
            "no real node runs in {} (for `start --real-nodes`, say which with --node N)",
            workdir.display()
        ),
    })?;
    match action {
        NodeAction::Reboot { .. } => node.reboot().map(drop),
        NodeAction::Exec { command, .. } => {
            let (program, rest) = command.split_first().context("no command")?;
            run_on_terminal(node.command(program).args(rest))
                .with_context(|| format!("cannot run {program} in the node"))
        }
    }
}

fn cri(action: &CriAction) -> anyhow::Result<()> {
    let client = CriClient::new(CRI_SOCKET);
    match action {
        CriAction::Ps => {
            for sandbox in client.sandboxes()? {
                let state = if sandbox.ready { "ready" } else { "stopped" };
                println!(
                    "sandbox {}/{} {state} {}",
                    sandbox.namespace, sandbox.name, sandbox.id
                );
            }
            for container in client.containers()? {
                println!(
                    "container {} {:?} sandbox={} {}",
                    container.name, container.state, container.sandbox_id, container.id
                );
            }
        }
        CriAction::Stop { pod } => {
            let (namespace, name) = pod
                .split_once('/')
                .ok_or_else(|| anyhow::anyhow!("expected NAMESPACE/NAME, got {pod:?}"))?;
            let stopped = client.stop_pod(namespace, name)?;
            PROGRESS.say(&format!(
                "stopped {pod}: {} container(s), {} sandbox(es)",
                stopped.containers, stopped.sandboxes
            ));
        }
    }
    Ok(())
}
