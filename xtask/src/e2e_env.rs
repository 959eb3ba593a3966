//! `cargo xtask e2e-env build|start|stop|apiserver`: the real control plane the end-to-end
//! tests run against (kube-apiserver v1.20.2 + etcd + kubemark's hollow kubelet; see
//! ARCHITECTURE.md, Testing).
//!
//! The Rust API is meant for other xtask tasks and the e2e harness as well:
//! [`ensure_built`] returns the cached [`BinDir`], [`ControlPlane::start`] starts a plane that
//! stops itself when dropped, and the plane can kill, pause, resume and restart its API server.
//! The CLI prints progress on stderr and, for `start`, `KEY=VALUE` lines on stdout.

mod build;
mod control_plane;
pub mod process;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::harness::cri::CriClient;
use crate::progress::Progress;

pub use build::{BinDir, KUBERNETES_VERSION, cache_root, ensure_built};
pub use control_plane::{AGENT_USER, CRI_SOCKET, ControlPlane, NODE_NAME, StartOptions};

/// The control plane's progress lines, from the CLI and the library alike.
const PROGRESS: Progress = Progress::new("e2e-env");

/// Build, start and stop the local control plane for the end-to-end tests.
#[derive(clap::Args)]
pub struct E2eEnv {
    #[command(subcommand)]
    command: E2eEnvCommand,
}

#[derive(clap::Subcommand)]
enum E2eEnvCommand {
    /// Install the Debian packages and build kube-apiserver + kubemark v1.20.2 into the cache
    /// ($E2E_CACHE_DIR, default /var/cache/pod-checkpointer-e2e); ~6 min cold, ~1 s cached.
    Build,
    /// Start etcd + kube-apiserver (+ hollow node) on loopback in a fresh work dir; prints
    /// WORKDIR=, KUBECONFIG=, STATIC_POD_DIR=, … lines on stdout.
    Start(StartArgs),
    /// Stop the processes a `start` left running in a work dir and remove the dir.
    Stop {
        #[arg(long)]
        workdir: PathBuf,
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

#[derive(clap::Args)]
struct StartArgs {
    /// Also run kubemark's hollow kubelet as node-1 (needs the kubelet ports and the fixed
    /// CRI socket /tmp/kubelet_remote.sock).
    #[arg(long)]
    hollow_node: bool,
    /// Work dir to create (must be missing or empty); default $TMPDIR/ckpt-e2e.XXXXXX.
    #[arg(long)]
    workdir: Option<PathBuf>,
    /// etcd client port; the peer port is the next one.
    #[arg(long, env = "ETCD_PORT", default_value_t = 2379)]
    etcd_port: u16,
    #[arg(long, env = "APISERVER_PORT", default_value_t = 6443)]
    apiserver_port: u16,
    #[arg(long, env = "KUBELET_PORT", default_value_t = 10250)]
    kubelet_port: u16,
    #[arg(long, env = "KUBELET_RO_PORT", default_value_t = 10255)]
    kubelet_read_only_port: u16,
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
            E2eEnvCommand::Build => ensure_built().map(drop),
            E2eEnvCommand::Start(args) => start(args),
            E2eEnvCommand::Stop { workdir } => {
                let started = Instant::now();
                ControlPlane::attach(workdir)?.stop()?;
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
        }
    }
}

fn start(args: &StartArgs) -> anyhow::Result<()> {
    let options = StartOptions {
        workdir: args.workdir.clone(),
        etcd_port: args.etcd_port,
        apiserver_port: args.apiserver_port,
        hollow_node: args.hollow_node,
        kubelet_port: args.kubelet_port,
        kubelet_read_only_port: args.kubelet_read_only_port,
        ..StartOptions::new(BinDir::cached()?)
    };
    let plane = ControlPlane::start(&options)?;
    for (key, value) in plane.env_vars() {
        println!("{key}={value}");
    }
    PROGRESS.say(&format!(
        "stop with: cargo xtask e2e-env stop --workdir {}",
        plane.workdir().display()
    ));
    plane.detach();
    Ok(())
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

/// `0.4 s`, `12.3 s`, `5 min 33 s`.
pub fn human_duration(duration: Duration) -> String {
    let secs = duration.as_secs_f64();
    if secs < 60.0 {
        format!("{secs:.1} s")
    } else {
        let whole = duration.as_secs();
        format!("{} min {} s", whole / 60, whole % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_seconds_or_minutes() {
        assert_eq!(human_duration(Duration::from_millis(420)), "0.4 s");
        assert_eq!(human_duration(Duration::from_millis(59_940)), "59.9 s");
        assert_eq!(human_duration(Duration::from_secs(333)), "5 min 33 s");
    }
}
