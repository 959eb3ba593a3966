//! A local control plane for the end-to-end tests: etcd and kube-apiserver on loopback, and
//! optionally kubemark's hollow kubelet registered as `node-1`, all in a fresh work dir.
//!
//! For the real node ([`StartOptions::real_node`]) the same plane binds the API server to the
//! host end of the node's veth pair (the plane creates the [`NodeNetwork`] and removes it
//! when it stops) and runs kube-controller-manager and kube-scheduler as processes, with
//! ServiceAccount admission and bound (projected) service-account tokens.
//!
//! The API server authenticates static tokens (admin in `system:masters`,
//! `system:node:node-1` in `system:nodes`, `pod-checkpointer` with no rights, and the
//! identities a self-hosted controller-manager and scheduler use) and authorizes with
//! `Node,RBAC`, so tests exercise the agent's real ClusterRole and the node's view. The flags
//! that replace a missing controller-manager are explained where they are set.
//!
//! Its serving certificate is signed by a CA of the work dir and names every address an API
//! server of this plane listens on: the host's (loopback or the veth's host end) and, with a
//! node network, the node's, where a self-hosted API server serves with the same
//! certificate (see [`crate::self_hosted`]).
//!
//! Work dir layout: `e2e-env.state` (the `KEY=VALUE` lines `start` prints; marks the dir as
//! ours), `*.pid`, `*.log`, `etcd/`, `certs/` (`ca.crt`, the clients' CA, and the API
//! server's `apiserver.crt` and key), `sa.key`, `tokens.csv`, `kubeconfig`, `kubeconfig-node-1`,
//! `kubeconfig-agent`, `audit-policy.yaml` and `audit.log` (the agent user's requests, see
//! [`ControlPlane::audit_log`]), with a hollow node `static-pods`, a link to the kubelet's
//! static pod dir, with the controllers `controller-manager.log`, `scheduler.log` and
//! `kcm-flex-volumes/`, and with a real node `node/` (see `real_node`).
//!
//! For several real nodes ([`StartOptions::real_nodes`]) the plane creates their [`Lan`]
//! instead and runs in the LAN's namespace (its processes through `nsenter --net`, its
//! probes too): the API server on the LAN's bridge address, and a kubeconfig
//! `kubeconfig-node-N` per node.
//!
//! The plane knows nothing of the node: a node started in its work dir has the plane stop it
//! first ([`ControlPlane::stop_first`]).

mod credentials;
mod flags;
mod hollow;
mod options;

use std::collections::BTreeMap;
use std::fs;
use std::net::Ipv4Addr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

pub use self::credentials::{
    AGENT_USER, CONTROLLER_MANAGER_USER, FLEET_GROUP, NODE_NAME, SCHEDULER_USER, fleet_user, node_name,
    render_kubeconfig,
};
use self::credentials::{identities, openssl, render_tokens_csv, serving_names, token_of, write_pki};
use self::flags::{
    AUDIT_LOG_FILE, AUDIT_POLICY_FILE, ApiserverFlags, apiserver_args, audit_policy, controller_manager_args,
    scheduler_args,
};
pub use self::hollow::CRI_SOCKET;
use self::hollow::{HollowNode, hollow_log_name, remove_hollow_root};
pub use self::options::StartOptions;
use self::options::{create_workdir, preflight};
use super::curl::{ApiEndpoint, http_probe, http_status};
use super::lan::{Lan, parse_lan};
use super::node_network::NodeNetwork;
use super::release::Release;
use super::state::parse_state;
use crate::process::{Managed, proc_state};
use crate::progress::{Progress, human_duration};
use crate::wait::{Probe, wait_for, wait_ready};

/// The progress lines of the environment: the plane's, the node's and `cargo xtask e2e-env`'s.
pub(crate) const PROGRESS: Progress = Progress::new("e2e-env");

const STATE_FILE: &str = "e2e-env.state";
const ETCD_PID_FILE: &str = "etcd.pid";
const APISERVER_PID_FILE: &str = "apiserver.pid";
const HOLLOW_PID_FILE: &str = "hollow-node.pid";
const CONTROLLER_MANAGER_PID_FILE: &str = "controller-manager.pid";
const SCHEDULER_PID_FILE: &str = "scheduler.pid";
const CONTROLLER_MANAGER_LOG: &str = "controller-manager.log";
const SCHEDULER_LOG: &str = "scheduler.log";

const ETCD_READY_TIMEOUT: Duration = Duration::from_secs(20);
const APISERVER_READY_TIMEOUT: Duration = Duration::from_secs(60);
const CONTROLLERS_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long etcd and the hollow node get to exit on SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(10);

/// A running (or partly started) control plane. Dropping it stops everything it started and
/// removes the work dir, unless it was [`detach`](ControlPlane::detach)ed or
/// [`attach`](ControlPlane::attach)ed.
pub struct ControlPlane {
    workdir: PathBuf,
    apiserver_bin: PathBuf,
    etcd_bin: PathBuf,
    /// The release of the binaries: their flags differ.
    release: Release,
    etcd_port: u16,
    apiserver_port: u16,
    /// 127.0.0.1, or the host end of the node network.
    bind_ip: Ipv4Addr,
    /// Whether the API server admits service accounts (the controllers run).
    service_accounts: bool,
    /// Identities for the fleet bench's agents (see [`StartOptions::fleet_agents`]).
    fleet_agents: usize,
    etcd: Option<Managed>,
    apiserver: Option<Managed>,
    hollow: Option<HollowNode>,
    controller_manager: Option<Managed>,
    scheduler: Option<Managed>,
    network: Option<CreatedNetwork>,
    /// The LAN this plane created and runs in, and whether creating it created `/run/netns`.
    lan: Option<(Lan, bool)>,
    /// See [`stop_first`](ControlPlane::stop_first).
    stop_first: OnceLock<fn(&Path) -> anyhow::Result<()>>,
    stop_on_drop: bool,
    stopped: bool,
}

/// The node network this plane created, and whether creating it created `/run/netns` too.
struct CreatedNetwork {
    network: NodeNetwork,
    created_run_dir: bool,
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver (and the hollow node if asked) and waits until they are
    /// ready. On failure everything started so far is stopped and the error carries the tail
    /// of the failing log. A plane on a LAN starts with [`start_on_lan`](Self::start_on_lan).
    pub fn start(options: &StartOptions) -> anyhow::Result<ControlPlane> {
        anyhow::ensure!(
            options.lan.is_none(),
            "a LAN's etcd members run on its nodes: start its plane with ControlPlane::start_on_lan"
        );
        ControlPlane::start_with(options, |_| Ok(())).map(|(plane, ())| plane)
    }

    /// Starts a plane on `options.lan`, whose etcd is one member per node: creates the LAN and
    /// the credentials, has `boot` start the nodes (their etcd members and kubelets: the
    /// plane cannot name them, they sit above it), then starts kube-apiserver on the members
    /// and the controllers. Returns what `boot` returned too; on failure everything started
    /// so far is stopped (what `boot` returned, by its own Drop).
    pub fn start_on_lan<T>(
        options: &StartOptions,
        boot: impl FnOnce(&ControlPlane) -> anyhow::Result<T>,
    ) -> anyhow::Result<(ControlPlane, T)> {
        anyhow::ensure!(
            options.lan.is_some(),
            "no LAN to start the plane on: see StartOptions::real_nodes"
        );
        ControlPlane::start_with(options, boot)
    }

    fn start_with<T>(
        options: &StartOptions,
        before_apiserver: impl FnOnce(&ControlPlane) -> anyhow::Result<T>,
    ) -> anyhow::Result<(ControlPlane, T)> {
        let started = Instant::now();
        preflight(options)?;
        let workdir = create_workdir(options.workdir.as_deref())?;
        PROGRESS.say(&format!("work dir {}", workdir.display()));
        // From here on, Drop cleans up whatever fails.
        let mut plane = ControlPlane {
            workdir,
            apiserver_bin: options.bins.kube_apiserver(),
            etcd_bin: options.bins.etcd().to_owned(),
            release: options.bins.release(),
            etcd_port: options.etcd_port,
            apiserver_port: options.apiserver_port,
            bind_ip: options.bind_ip(),
            service_accounts: options.controllers,
            fleet_agents: options.fleet_agents,
            etcd: None,
            apiserver: None,
            hollow: None,
            controller_manager: None,
            scheduler: None,
            network: None,
            lan: None,
            stop_first: OnceLock::new(),
            stop_on_drop: true,
            stopped: false,
        };
        plane.write_state()?;
        if let Some(network) = &options.node_network {
            let created_run_dir = network.create()?;
            plane.network = Some(CreatedNetwork {
                network: network.clone(),
                created_run_dir,
            });
            plane.write_state()?;
            PROGRESS.say(&format!(
                "node network {}: {} {} <-> {} {} (no default route), pods {} via the veth",
                network.netns,
                network.host_link,
                network.host_ip,
                network.node_link,
                network.node_ip,
                network.pod_cidr_text()
            ));
        }
        if let Some(lan) = &options.lan {
            let created_run_dir = lan.create()?;
            plane.lan = Some((lan.clone(), created_run_dir));
            plane.write_state()?;
            let nodes: Vec<String> = lan
                .nodes
                .iter()
                .map(|node| format!("{} (pods {})", node.node_ip, node.pod_cidr_text()))
                .collect();
            PROGRESS.say(&format!(
                "LAN {}: bridge {} {} (the plane's), nodes {} (no default route)",
                lan.netns,
                lan.bridge,
                lan.ip,
                nodes.join(", ")
            ));
        }
        // A LAN's etcd is its nodes' members, which `before_apiserver` starts.
        if plane.lan.is_none() {
            plane.start_etcd()?;
        }
        plane.write_credentials()?;
        let booted = before_apiserver(&plane)?;
        // On failure what `before_apiserver` started goes first: nodes talk to the plane.
        match plane.start_servers(options, started) {
            Ok(()) => Ok((plane, booted)),
            Err(e) => {
                drop(booted);
                Err(e)
            }
        }
    }

    /// kube-apiserver, then the controllers and the hollow node if asked.
    fn start_servers(&mut self, options: &StartOptions, started: Instant) -> anyhow::Result<()> {
        self.spawn_apiserver()?;
        let ready_after = self.wait_apiserver_ready()?;
        PROGRESS.say(&format!(
            "kube-apiserver ready at {} after {} (total {})",
            self.apiserver_url(),
            human_duration(ready_after),
            human_duration(started.elapsed())
        ));
        if options.controllers {
            self.start_controllers(options)?;
        }
        if options.hollow_node {
            self.start_hollow_node(options)?;
        }
        self.write_state()?;
        PROGRESS.say(&format!(
            "control plane up in {}",
            human_duration(started.elapsed())
        ));
        Ok(())
    }

    /// The control plane that `start` left running in `workdir` (e.g. from another process).
    /// Dropping it stops nothing; [`stop`](ControlPlane::stop) stops it.
    pub fn attach(workdir: &Path) -> anyhow::Result<ControlPlane> {
        let state_path = workdir.join(STATE_FILE);
        let state = fs::read_to_string(&state_path).with_context(|| {
            format!(
                "{} is not an e2e-env work dir (cannot read {})",
                workdir.display(),
                state_path.display()
            )
        })?;
        let state = parse_state(&state);
        let get = |key: &str| {
            state
                .get(key)
                .with_context(|| format!("{} has no {key}", state_path.display()))
        };
        let port = |key: &str| -> anyhow::Result<u16> {
            get(key)?
                .parse()
                .with_context(|| format!("bad {key} in {}", state_path.display()))
        };
        // The processes carry the work dir as spelled at start; that spelling marks them ours.
        let recorded = PathBuf::from(get("WORKDIR")?);
        let same_dir = fs::canonicalize(&recorded).ok() == fs::canonicalize(workdir).ok();
        anyhow::ensure!(
            same_dir,
            "{} records the work dir {}, not this one",
            state_path.display(),
            recorded.display()
        );
        let workdir = recorded.as_path();
        let read_pid =
            |file: &str| -> Option<u32> { fs::read_to_string(workdir.join(file)).ok()?.trim().parse().ok() };
        let attach = |name, pid, log: &str| Managed::attach(name, pid, &workdir.join(log), workdir);
        // A start that died early may not have recorded the kubelet ports; stopping needs none.
        let port_or_zero = |key: &str| port(key).unwrap_or(0);
        // kubemark sits beside kube-apiserver in the bin dir.
        let kubemark = PathBuf::from(get("KUBE_APISERVER_BIN")?).with_file_name("kubemark");
        let hollow = read_pid(HOLLOW_PID_FILE).map(|pid| HollowNode {
            process: attach("hollow node", pid, &hollow_log_name()),
            kubemark,
            kubelet_port: port_or_zero("KUBELET_PORT"),
            kubelet_read_only_port: port_or_zero("KUBELET_READ_ONLY_PORT"),
            root_dir: state
                .get("HOLLOW_ROOT_DIR")
                .filter(|d| !d.is_empty())
                .map(PathBuf::from),
        });
        let network = parse_network(&state);
        let lan = match state.get("LAN").filter(|json| !json.is_empty()) {
            Some(json) => Some((
                parse_lan(json)?,
                state.get("LAN_CREATED_RUN_DIR").is_some_and(|v| v == "true"),
            )),
            None => None,
        };
        let bind_ip = match (&lan, &network) {
            (Some((lan, _)), _) => lan.ip,
            (None, Some(created)) => created.network.host_ip,
            (None, None) => Ipv4Addr::LOCALHOST,
        };
        Ok(ControlPlane {
            workdir: workdir.to_owned(),
            apiserver_bin: PathBuf::from(get("KUBE_APISERVER_BIN")?),
            // Work dirs from before releases were recorded are v1.20's, with Debian's etcd.
            etcd_bin: PathBuf::from(get("ETCD_BIN").map_or("etcd", String::as_str)),
            release: (get("KUBERNETES_RELEASE").ok())
                .and_then(|r| <Release as clap::ValueEnum>::from_str(r, false).ok())
                .unwrap_or(Release::V1_20),
            etcd_port: port("ETCD_PORT")?,
            apiserver_port: port("APISERVER_PORT")?,
            bind_ip,
            service_accounts: state.get("SERVICE_ACCOUNTS").is_some_and(|v| v == "true"),
            // Only writing the credentials needs it; tokens.csv has them already.
            fleet_agents: 0,
            etcd: read_pid(ETCD_PID_FILE).map(|pid| attach("etcd", pid, "etcd.log")),
            apiserver: read_pid(APISERVER_PID_FILE).map(|pid| attach("kube-apiserver", pid, "apiserver.log")),
            hollow,
            controller_manager: read_pid(CONTROLLER_MANAGER_PID_FILE)
                .map(|pid| attach("kube-controller-manager", pid, CONTROLLER_MANAGER_LOG)),
            scheduler: read_pid(SCHEDULER_PID_FILE).map(|pid| attach("kube-scheduler", pid, SCHEDULER_LOG)),
            network,
            lan,
            stop_first: OnceLock::new(),
            stop_on_drop: false,
            stopped: false,
        })
    }

    /// Has `stop` run on the work dir before this plane stops anything: what starts a real
    /// node there sets it (the node's kubelet talks to the API server, and its mount namespace
    /// pins files in the work dir), since the plane sits below the node and cannot name it.
    /// Set once; later calls change nothing.
    pub fn stop_first(&self, stop: fn(&Path) -> anyhow::Result<()>) {
        let _ = self.stop_first.set(stop);
    }

    /// Leaves the processes running when this value is dropped (`cargo xtask e2e-env start`).
    pub fn detach(mut self) {
        self.stop_on_drop = false;
    }

    /// Stops the hollow node, kube-apiserver (SIGKILL: on SIGTERM it takes 60 s) and etcd,
    /// waits for them to exit and removes the work dir.
    pub fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown()
    }

    pub fn workdir(&self) -> &Path {
        &self.workdir
    }

    /// The admin (`system:masters`) kubeconfig.
    pub fn kubeconfig(&self) -> PathBuf {
        self.workdir.join("kubeconfig")
    }

    /// The kubeconfig of `system:node:node-1` (group `system:nodes`).
    pub fn node_kubeconfig(&self) -> PathBuf {
        self.kubeconfig_of_node(NODE_NAME)
    }

    /// The kubeconfig of `system:node:NAME`: each of a LAN's nodes has one.
    pub fn kubeconfig_of_node(&self, name: &str) -> PathBuf {
        self.workdir.join(format!("kubeconfig-{name}"))
    }

    /// The kubeconfig of the user `pod-checkpointer`, which has no rights until RBAC grants some.
    pub fn agent_kubeconfig(&self) -> PathBuf {
        self.workdir.join("kubeconfig-agent")
    }

    /// The API server's audit log (JSON lines, appended to across restarts): every request
    /// of the agent's user [`AGENT_USER`], nobody else's.
    pub fn audit_log(&self) -> PathBuf {
        self.workdir.join(AUDIT_LOG_FILE)
    }

    /// The CA that signed the API server's serving certificate: what clients verify it with.
    pub fn ca_cert(&self) -> PathBuf {
        self.workdir.join("certs/ca.crt")
    }

    /// The API server's serving certificate and its key (`certs/apiserver.{crt,key}`).
    pub fn serving_cert(&self) -> (PathBuf, PathBuf) {
        let certs = self.workdir.join("certs");
        (certs.join("apiserver.crt"), certs.join("apiserver.key"))
    }

    /// The static token file (`token,user,uid,"groups"` lines) the API server authenticates.
    pub fn tokens_csv(&self) -> PathBuf {
        self.workdir.join("tokens.csv")
    }

    /// The token of `user` in [`tokens_csv`](ControlPlane::tokens_csv), e.g. `admin` or
    /// [`CONTROLLER_MANAGER_USER`].
    pub fn token(&self, user: &str) -> anyhow::Result<String> {
        let csv = fs::read_to_string(self.tokens_csv()).context("cannot read tokens.csv")?;
        token_of(&csv, user).with_context(|| format!("tokens.csv has no {user}"))
    }

    /// Writes `<work dir>/<file>`, a kubeconfig for `user` of [`tokens_csv`](Self::tokens_csv)
    /// against `server` (another API server of this plane, e.g. a self-hosted one), verified
    /// with [`ca_cert`](Self::ca_cert); returns its path.
    pub fn write_kubeconfig(&self, file: &str, server: &str, user: &str) -> anyhow::Result<PathBuf> {
        let path = self.workdir.join(file);
        let text = render_kubeconfig(
            server,
            &self.ca_cert(),
            &user.replace(':', "-"),
            &self.token(user)?,
        );
        fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(path)
    }

    /// The Kubernetes release the plane runs.
    pub fn release(&self) -> Release {
        self.release
    }

    /// `https://127.0.0.1:PORT`, or with a node network `https://<host end of the veth>:PORT`.
    pub fn apiserver_url(&self) -> String {
        format!("https://{}:{}", self.bind_ip, self.apiserver_port)
    }

    /// The node network the plane created, if it was started with one.
    pub fn node_network(&self) -> Option<&NodeNetwork> {
        self.network.as_ref().map(|created| &created.network)
    }

    /// The LAN the plane created and runs in, if it was started with one.
    pub fn lan(&self) -> Option<&Lan> {
        self.lan.as_ref().map(|(lan, _)| lan)
    }

    /// The network namespace the plane's processes and clients run in: the LAN's, or `None`
    /// (this process's).
    pub fn netns(&self) -> Option<PathBuf> {
        self.lan().map(Lan::netns_path)
    }

    /// A command for `program` where the plane's clients run (see [`netns`](Self::netns)).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        match self.lan() {
            Some(lan) => lan.command(program),
            None => Command::new(program),
        }
    }

    /// The names of the nodes the plane has identities for: `node-1`, and a LAN's others.
    pub fn node_names(&self) -> Vec<String> {
        let count = self.lan().map_or(1, |lan| lan.nodes.len());
        (1..=count).map(node_name).collect()
    }

    pub fn apiserver_port(&self) -> u16 {
        self.apiserver_port
    }

    pub fn etcd_port(&self) -> u16 {
        self.etcd_port
    }

    /// What the plane's API server names as `--etcd-servers`: the plane's etcd, or every
    /// member of a LAN's.
    pub fn etcd_servers(&self) -> String {
        match self.lan() {
            Some(lan) => lan.etcd_servers(),
            None => format!("http://127.0.0.1:{}", self.etcd_port),
        }
    }

    pub fn etcd_pid(&self) -> Option<u32> {
        self.etcd.as_ref().map(Managed::pid)
    }

    pub fn apiserver_pid(&self) -> Option<u32> {
        self.apiserver.as_ref().map(Managed::pid)
    }

    pub fn hollow_node_pid(&self) -> Option<u32> {
        self.hollow.as_ref().map(|h| h.process.pid())
    }

    pub fn controller_manager_pid(&self) -> Option<u32> {
        self.controller_manager.as_ref().map(Managed::pid)
    }

    pub fn scheduler_pid(&self) -> Option<u32> {
        self.scheduler.as_ref().map(Managed::pid)
    }

    /// The service-account signing key (also what verifies the tokens).
    pub fn service_account_key(&self) -> PathBuf {
        self.workdir.join("sa.key")
    }

    /// The hollow kubelet's static pod dir as a stable path in the work dir (a link to the
    /// dir kubemark creates under `/tmp/hollow-kubelet.NNN`). Write manifests (JSON or YAML)
    /// under a dot-name first and rename them in: the kubelet skips dot files.
    pub fn static_pod_dir(&self) -> Option<PathBuf> {
        self.hollow.as_ref().map(|_| self.workdir.join("static-pods"))
    }

    /// The hollow kubelet's API, plain HTTP (`/pods/`, `/runningpods/`).
    pub fn kubelet_url(&self) -> Option<String> {
        self.hollow
            .as_ref()
            .map(|h| format!("http://127.0.0.1:{}", h.kubelet_port))
    }

    /// The hollow kubelet's read-only API (what bootkube's checkpointer falls back to).
    pub fn kubelet_read_only_url(&self) -> Option<String> {
        self.hollow
            .as_ref()
            .map(|h| format!("http://127.0.0.1:{}", h.kubelet_read_only_port))
    }

    /// `GET path` on the API server as admin; returns the HTTP status (0 when unreachable
    /// within 5 s) and the body.
    pub fn api_get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        self.api().get(path)
    }

    /// SIGKILLs the API server (connections are refused afterwards) and waits for it to exit.
    pub fn kill_apiserver(&mut self) -> anyhow::Result<()> {
        self.apiserver_mut()?.terminate("KILL", Duration::from_secs(10))?;
        PROGRESS.say("kube-apiserver killed");
        Ok(())
    }

    /// SIGSTOPs the API server: it keeps its port, accepts connections and answers nothing.
    pub fn pause_apiserver(&mut self) -> anyhow::Result<()> {
        let pid = self.signal_apiserver("pause", "STOP")?;
        wait_for(
            &format!("kube-apiserver (pid {pid}) to stop on SIGSTOP"),
            Duration::from_secs(5),
            || {
                Ok(match proc_state(pid) {
                    Some('T') => Probe::Ready(()),
                    state => Probe::Waiting(format!("process state {state:?}")),
                })
            },
        )?;
        PROGRESS.say("kube-apiserver paused (SIGSTOP)");
        Ok(())
    }

    /// SIGCONTs a paused API server.
    pub fn resume_apiserver(&mut self) -> anyhow::Result<()> {
        self.signal_apiserver("resume", "CONT")?;
        PROGRESS.say("kube-apiserver resumed (SIGCONT)");
        Ok(())
    }

    /// Kills the API server if it runs and starts it again on the same etcd, certs, tokens and
    /// port; returns once `/readyz` answers 200, with the time that took.
    pub fn restart_apiserver(&mut self) -> anyhow::Result<Duration> {
        if let Some(apiserver) = &mut self.apiserver {
            apiserver.terminate("KILL", Duration::from_secs(10))?;
        }
        let started = Instant::now();
        self.spawn_apiserver()?;
        self.write_state()?;
        self.wait_apiserver_ready()?;
        let took = started.elapsed();
        PROGRESS.say(&format!(
            "kube-apiserver restarted, ready after {}",
            human_duration(took)
        ));
        Ok(took)
    }

    /// What `cargo xtask e2e-env start` prints and the state file holds, as `KEY=VALUE` pairs.
    pub fn env_vars(&self) -> Vec<(&'static str, String)> {
        let path = |p: &Path| p.display().to_string();
        let mut vars = vec![
            ("WORKDIR", path(&self.workdir)),
            ("KUBECONFIG", path(&self.kubeconfig())),
            ("KUBECONFIG_NODE", path(&self.node_kubeconfig())),
            ("KUBECONFIG_AGENT", path(&self.agent_kubeconfig())),
            ("APISERVER_URL", self.apiserver_url()),
            ("CA_CERT", path(&self.ca_cert())),
            ("APISERVER_PORT", self.apiserver_port().to_string()),
            ("ETCD_PORT", self.etcd_port().to_string()),
            ("KUBE_APISERVER_BIN", path(&self.apiserver_bin)),
            ("ETCD_BIN", path(&self.etcd_bin)),
            ("KUBERNETES_RELEASE", self.release.name().to_owned()),
        ];
        let pid = |pid: Option<u32>| pid.map(|p| p.to_string()).unwrap_or_default();
        vars.push(("ETCD_PID", pid(self.etcd_pid())));
        vars.push(("APISERVER_PID", pid(self.apiserver_pid())));
        vars.push(("SERVICE_ACCOUNTS", self.service_accounts.to_string()));
        if self.service_accounts {
            vars.push(("CONTROLLER_MANAGER_PID", pid(self.controller_manager_pid())));
            vars.push(("SCHEDULER_PID", pid(self.scheduler_pid())));
        }
        if let Some(CreatedNetwork {
            network,
            created_run_dir,
        }) = &self.network
        {
            vars.push(("NODE_NETNS", network.netns.clone()));
            vars.push(("NODE_HOST_LINK", network.host_link.clone()));
            vars.push(("NODE_HOST_IP", network.host_ip.to_string()));
            vars.push(("NODE_IP", network.node_ip.to_string()));
            vars.push(("POD_CIDR", network.pod_cidr_text()));
            vars.push(("NODE_NETNS_CREATED_RUN_DIR", created_run_dir.to_string()));
        }
        if let Some((lan, created_run_dir)) = &self.lan {
            vars.push(("LAN_NETNS", lan.netns.clone()));
            vars.push(("LAN_IP", lan.ip.to_string()));
            vars.push(("LAN", serde_json::to_string(lan).unwrap_or_default()));
            vars.push(("LAN_CREATED_RUN_DIR", created_run_dir.to_string()));
        }
        if let Some(hollow) = &self.hollow {
            vars.push(("NODE_NAME", NODE_NAME.to_owned()));
            vars.push((
                "STATIC_POD_DIR",
                self.static_pod_dir().as_deref().map(path).unwrap_or_default(),
            ));
            vars.push((
                "HOLLOW_ROOT_DIR",
                hollow.root_dir.as_deref().map(path).unwrap_or_default(),
            ));
            vars.push(("CRI_SOCKET", format!("unix://{CRI_SOCKET}")));
            vars.push(("KUBELET_PORT", hollow.kubelet_port.to_string()));
            vars.push((
                "KUBELET_READ_ONLY_PORT",
                hollow.kubelet_read_only_port.to_string(),
            ));
            vars.push(("KUBELET_URL", self.kubelet_url().unwrap_or_default()));
            vars.push((
                "KUBELET_READ_ONLY_URL",
                self.kubelet_read_only_url().unwrap_or_default(),
            ));
            vars.push(("HOLLOW_NODE_PID", pid(self.hollow_node_pid())));
        }
        vars
    }

    /// The API server as admin.
    pub(crate) fn api(&self) -> ApiEndpoint {
        let token = self.token("admin").unwrap_or_default();
        ApiEndpoint {
            url: self.apiserver_url(),
            ca: self.ca_cert(),
            token,
            netns: self.netns(),
        }
    }

    fn apiserver_mut(&mut self) -> anyhow::Result<&mut Managed> {
        self.apiserver.as_mut().context("no kube-apiserver was started")
    }

    /// Sends `signal` to the API server, which must be running (else: cannot `verb` it);
    /// returns its pid.
    fn signal_apiserver(&mut self, verb: &str, signal: &str) -> anyhow::Result<u32> {
        let apiserver = self.apiserver_mut()?;
        apiserver.ensure_running(&format!("cannot {verb} kube-apiserver"))?;
        apiserver.signal(signal)?;
        Ok(apiserver.pid())
    }

    fn write_state(&self) -> anyhow::Result<()> {
        let text: String = self
            .env_vars()
            .iter()
            .map(|(k, v)| format!("{k}={v}\n"))
            .collect();
        let path = self.workdir.join(STATE_FILE);
        fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))
    }

    fn write_pid(&self, file: &str, pid: u32) -> anyhow::Result<()> {
        fs::write(self.workdir.join(file), format!("{pid}\n")).with_context(|| format!("cannot write {file}"))
    }

    fn start_etcd(&mut self) -> anyhow::Result<()> {
        let client = format!("http://127.0.0.1:{}", self.etcd_port);
        let peer = format!("http://127.0.0.1:{}", self.etcd_port + 1);
        // With a node network, also on the veth's host end: an API server on the node (a
        // self-hosted one) reaches etcd there, as an external etcd of a cluster.
        let listen = match self.node_network() {
            Some(network) => format!("{client},http://{}:{}", network.host_ip, self.etcd_port),
            None => client.clone(),
        };
        let mut command = self.command(&self.etcd_bin);
        command
            .args(["--name", "e2e", "--data-dir"])
            .arg(self.workdir.join("etcd"))
            .args([
                "--listen-client-urls",
                &listen,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("e2e={peer}")]);
        let etcd = Managed::spawn(
            "etcd",
            &mut command,
            &self.workdir.join("etcd.log"),
            &self.workdir,
        )?;
        self.write_pid(ETCD_PID_FILE, etcd.pid())?;
        let netns = self.netns();
        let etcd = self.etcd.insert(etcd);
        let health = format!("{client}/health");
        let log = etcd.log().to_owned();
        let ((), took) = wait_ready("etcd /health 200", ETCD_READY_TIMEOUT, &log, || {
            etcd.ensure_running(&format!("etcd failed (port {} busy?)", self.etcd_port))?;
            Ok(http_probe(http_status(netns.as_deref(), &health, &[])))
        })?;
        PROGRESS.say(&format!(
            "etcd healthy on {client} after {}",
            human_duration(took)
        ));
        Ok(())
    }

    /// The CA and serving certificate, the service-account key, the tokens and a kubeconfig
    /// for the first three.
    fn write_credentials(&mut self) -> anyhow::Result<()> {
        let node_ips: Vec<Ipv4Addr> = match (self.lan(), self.node_network()) {
            (Some(lan), _) => lan.nodes.iter().map(|node| node.node_ip).collect(),
            (None, network) => network.iter().map(|network| network.node_ip).collect(),
        };
        write_pki(
            &self.workdir.join("certs"),
            &serving_names(self.bind_ip, &node_ips),
        )?;
        let sa_key = self.service_account_key();
        openssl(&["genrsa", "-out", &sa_key.to_string_lossy(), "2048"])?;

        let more_nodes = self.node_names().split_off(1);
        let identities = identities(self.fleet_agents, &more_nodes)?;
        fs::write(self.workdir.join("tokens.csv"), render_tokens_csv(&identities))?;
        fs::write(
            self.workdir.join(AUDIT_POLICY_FILE),
            audit_policy(AGENT_USER, FLEET_GROUP),
        )?;
        // The API server creates its log with the first event and appends to an existing one:
        // created here, its length is a window boundary from the start.
        fs::write(self.audit_log(), "")?;
        let server = self.apiserver_url();
        let ca = self.ca_cert();
        let kubeconfigs = [self.kubeconfig(), self.node_kubeconfig(), self.agent_kubeconfig()];
        for (path, identity) in kubeconfigs.iter().zip(&identities) {
            let user = identity.user.replace(':', "-");
            fs::write(path, render_kubeconfig(&server, &ca, &user, &identity.token))
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        for name in &more_nodes {
            self.write_kubeconfig(
                &format!("kubeconfig-{name}"),
                &server,
                &format!("system:node:{name}"),
            )?;
        }
        Ok(())
    }

    fn spawn_apiserver(&mut self) -> anyhow::Result<()> {
        let mut command = self.command(&self.apiserver_bin);
        command.args(apiserver_args(&ApiserverFlags {
            release: self.release,
            workdir: &self.workdir,
            etcd_servers: self.etcd_servers(),
            apiserver_port: self.apiserver_port,
            bind_ip: self.bind_ip,
            service_accounts: self.service_accounts,
        }));
        if let Some(godebug) = self.release.apiserver_godebug() {
            command.env("GODEBUG", godebug);
        }
        let apiserver = Managed::spawn(
            "kube-apiserver",
            &mut command,
            &self.workdir.join("apiserver.log"),
            &self.workdir,
        )?;
        self.write_pid(APISERVER_PID_FILE, apiserver.pid())?;
        self.apiserver = Some(apiserver);
        Ok(())
    }

    fn wait_apiserver_ready(&mut self) -> anyhow::Result<Duration> {
        let api = self.api();
        let apiserver = self.apiserver_mut()?;
        let log = apiserver.log().to_owned();
        let ((), took) = wait_ready(
            "kube-apiserver /readyz 200",
            APISERVER_READY_TIMEOUT,
            &log,
            || {
                apiserver.ensure_running("kube-apiserver did not become ready")?;
                Ok(http_probe(api.get("/readyz")?.0))
            },
        )?;
        Ok(took)
    }

    /// Stops kube-controller-manager and kube-scheduler (SIGTERM): a self-hosted copy takes
    /// their Leases over once they expire.
    pub fn stop_controllers(&mut self) -> anyhow::Result<()> {
        for process in [&mut self.scheduler, &mut self.controller_manager] {
            if let Some(running) = process {
                running.terminate("TERM", TERM_GRACE)?;
            }
            *process = None;
        }
        for file in [CONTROLLER_MANAGER_PID_FILE, SCHEDULER_PID_FILE] {
            let _ = fs::remove_file(self.workdir.join(file));
        }
        self.write_state()?;
        PROGRESS.say("kube-controller-manager and kube-scheduler stopped");
        Ok(())
    }

    /// kube-controller-manager and kube-scheduler with the admin kubeconfig; waits for their
    /// health and for what pods need before they are admitted: the `default` ServiceAccount
    /// (serviceaccount controller) and `kube-root-ca.crt` (root-ca-cert-publisher). With
    /// leader election, they act once they hold their Leases.
    pub fn start_controllers(&mut self, options: &StartOptions) -> anyhow::Result<()> {
        let started = Instant::now();
        let kubeconfig = self.kubeconfig();
        let mut kcm = self.command(options.bins.kube_controller_manager());
        kcm.args(controller_manager_args(
            self.release,
            &self.workdir,
            &kubeconfig,
            &self.ca_cert(),
            options.controller_manager_port,
        ));
        let kcm = Managed::spawn(
            "kube-controller-manager",
            &mut kcm,
            &self.workdir.join(CONTROLLER_MANAGER_LOG),
            &self.workdir,
        )?;
        self.write_pid(CONTROLLER_MANAGER_PID_FILE, kcm.pid())?;
        self.controller_manager = Some(kcm);
        let mut scheduler = self.command(options.bins.kube_scheduler());
        scheduler.args(scheduler_args(self.release, &kubeconfig, options.scheduler_port));
        let scheduler = Managed::spawn(
            "kube-scheduler",
            &mut scheduler,
            &self.workdir.join(SCHEDULER_LOG),
            &self.workdir,
        )?;
        self.write_pid(SCHEDULER_PID_FILE, scheduler.pid())?;
        self.scheduler = Some(scheduler);
        self.write_state()?;

        let api = self.api();
        let netns = self.netns();
        for (process, port) in [
            (&mut self.controller_manager, options.controller_manager_port),
            (&mut self.scheduler, options.scheduler_port),
        ] {
            let process = process.as_mut().context("a controller vanished")?;
            let name = process.name();
            let log = process.log().to_owned();
            let healthz = format!("https://127.0.0.1:{port}/healthz");
            wait_ready(
                &format!("{name} /healthz 200"),
                CONTROLLERS_READY_TIMEOUT,
                &log,
                || {
                    process.ensure_running(&format!("{name} did not become healthy"))?;
                    // Its serving cert is self-signed in memory: nothing to verify it with.
                    Ok(http_probe(http_status(
                        netns.as_deref(),
                        &healthz,
                        &["--insecure"],
                    )))
                },
            )?;
        }
        let kcm = self
            .controller_manager
            .as_mut()
            .context("kube-controller-manager vanished")?;
        let log = kcm.log().to_owned();
        for (what, path) in [
            (
                "ServiceAccount default/default",
                "/api/v1/namespaces/default/serviceaccounts/default",
            ),
            (
                "ConfigMap default/kube-root-ca.crt",
                "/api/v1/namespaces/default/configmaps/kube-root-ca.crt",
            ),
        ] {
            wait_ready(what, CONTROLLERS_READY_TIMEOUT, &log, || {
                kcm.ensure_running("kube-controller-manager stopped")?;
                Ok(http_probe(api.get(path)?.0))
            })?;
        }
        PROGRESS.say(&format!(
            "kube-controller-manager and kube-scheduler healthy, default ServiceAccount and kube-root-ca.crt published after {}",
            human_duration(started.elapsed())
        ));
        Ok(())
    }

    fn start_hollow_node(&mut self, options: &StartOptions) -> anyhow::Result<()> {
        self.spawn_hollow_node(
            options.bins.kubemark(),
            options.kubelet_port,
            options.kubelet_read_only_port,
        )
    }

    /// Whether the hollow node runs (`false` without one).
    pub fn hollow_node_running(&mut self) -> bool {
        self.hollow.as_mut().is_some_and(|h| h.process.is_running())
    }

    /// Starts the hollow node again, with the same ports, after it died (kubemark's fake OS
    /// is not thread-safe: a run saw it crash with "concurrent map writes"), and waits for
    /// the Node to be Ready; the static pod link points at its new dir.
    pub fn restart_hollow_node(&mut self) -> anyhow::Result<()> {
        let mut old = self.hollow.take().context("no hollow node to restart")?;
        old.process.terminate("KILL", TERM_GRACE)?;
        if let Some(root) = &old.root_dir
            && let Err(e) = remove_hollow_root(root)
        {
            PROGRESS.say(&format!("the dead hollow node's dir stays: {e:#}"));
        }
        // Kept beside the new one: the new log must name the new root dir alone.
        let log = self.workdir.join(hollow_log_name());
        let kept = self.workdir.join(format!("{}.died", hollow_log_name()));
        fs::rename(&log, &kept).with_context(|| format!("cannot move {} aside", log.display()))?;
        let link = self.workdir.join("static-pods");
        match fs::remove_file(&link) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("cannot remove {}", link.display())),
        }
        self.spawn_hollow_node(old.kubemark, old.kubelet_port, old.kubelet_read_only_port)?;
        // The Node may still read Ready from before the crash: wait for the new kubelet's
        // own port too.
        let port = old.kubelet_port;
        wait_for(
            "the restarted hollow kubelet's port",
            Duration::from_secs(30),
            || {
                Ok(match std::net::TcpStream::connect(("127.0.0.1", port)) {
                    Ok(_) => Probe::Ready(()),
                    Err(e) => Probe::Waiting(e.to_string()),
                })
            },
        )?;
        Ok(())
    }

    fn spawn_hollow_node(
        &mut self,
        kubemark: PathBuf,
        kubelet_port: u16,
        kubelet_read_only_port: u16,
    ) -> anyhow::Result<()> {
        let started = Instant::now();
        let hollow = HollowNode::spawn(
            self.release,
            kubemark,
            kubelet_port,
            kubelet_read_only_port,
            &self.workdir,
            &self.node_kubeconfig(),
        )?;
        self.write_pid(HOLLOW_PID_FILE, hollow.process.pid())?;
        self.hollow = Some(hollow);
        self.write_state()?;
        let hollow = self.hollow.as_mut().context("hollow node vanished")?;
        let (link, real_static_dir) = hollow.link_static_pods(&self.workdir)?;
        if let Some(socket) = self.release.hollow_cri_socket() {
            hollow.link_cri_socket(Path::new(socket))?;
        }
        self.write_state()?;
        let api = self.api();
        let hollow = self.hollow.as_mut().context("hollow node vanished")?;
        let took = hollow.wait_ready(&api)?;
        PROGRESS.say(&format!(
            "hollow node {NODE_NAME} Ready after {} (total {}); static pods: {} -> {}",
            human_duration(took),
            human_duration(started.elapsed()),
            link.display(),
            real_static_dir.display()
        ));
        Ok(())
    }

    /// Stops everything, hollow node first (it talks to the API server), then removes the work
    /// dir; keeps the dir when a process would not exit, so its pids are not lost.
    fn shutdown(&mut self) -> anyhow::Result<()> {
        self.stopped = true;
        let mut errors = Vec::new();
        if let Some(stop_first) = self.stop_first.get()
            && let Err(e) = stop_first(&self.workdir)
        {
            errors.push(e);
        }
        for process in [&mut self.scheduler, &mut self.controller_manager]
            .into_iter()
            .flatten()
        {
            if let Err(e) = process.terminate("TERM", TERM_GRACE) {
                errors.push(e);
            }
        }
        if let Some(hollow) = &mut self.hollow {
            match hollow.process.terminate("TERM", TERM_GRACE) {
                Ok(()) => {
                    // Only a socket nobody answers on is ours to remove (and the one the
                    // link named, for a kubemark that does not use the fixed one).
                    if UnixStream::connect(CRI_SOCKET).is_err() {
                        let _ = fs::remove_file(CRI_SOCKET);
                        if let Some(socket) = self.release.hollow_cri_socket() {
                            let _ = fs::remove_file(socket);
                        }
                    }
                    if let Some(root) = &hollow.root_dir
                        && let Err(e) = remove_hollow_root(root)
                    {
                        errors.push(e);
                    }
                }
                Err(e) => errors.push(e),
            }
        }
        if let Some(apiserver) = &mut self.apiserver
            && let Err(e) = apiserver.terminate("KILL", Duration::from_secs(10))
        {
            errors.push(e);
        }
        if let Some(etcd) = &mut self.etcd
            && let Err(e) = etcd.terminate("TERM", TERM_GRACE)
        {
            errors.push(e);
        }
        if let Some(created) = &self.network
            && let Err(e) = created.network.remove(created.created_run_dir)
        {
            errors.push(e);
        }
        if let Some((lan, created_run_dir)) = &self.lan
            && let Err(e) = lan.remove(*created_run_dir)
        {
            errors.push(e);
        }
        if errors.is_empty() {
            fs::remove_dir_all(&self.workdir)
                .with_context(|| format!("cannot remove {}", self.workdir.display()))?;
            return Ok(());
        }
        let messages: Vec<String> = errors.iter().map(|e| format!("{e:#}")).collect();
        bail!(
            "stopping the control plane in {} failed: {}",
            self.workdir.display(),
            messages.join("; ")
        )
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if self.stop_on_drop
            && !self.stopped
            && let Err(e) = self.shutdown()
        {
            PROGRESS.say(&format!("cleanup failed: {e:#}"));
        }
    }
}

/// The node network a state file records, if any.
fn parse_network(state: &BTreeMap<String, String>) -> Option<CreatedNetwork> {
    let netns = state.get("NODE_NETNS").filter(|n| !n.is_empty())?;
    let mut network = NodeNetwork::project();
    netns.clone_into(&mut network.netns);
    if let Some(link) = state.get("NODE_HOST_LINK") {
        link.clone_into(&mut network.host_link);
    }
    if let Some(ip) = state.get("NODE_HOST_IP").and_then(|ip| ip.parse().ok()) {
        network.host_ip = ip;
    }
    if let Some(ip) = state.get("NODE_IP").and_then(|ip| ip.parse().ok()) {
        network.node_ip = ip;
    }
    if let Some((ip, len)) = state.get("POD_CIDR").and_then(|cidr| cidr.split_once('/'))
        && let (Ok(ip), Ok(len)) = (ip.parse(), len.parse())
    {
        network.pod_cidr = ip;
        network.pod_prefix_len = len;
    }
    Some(CreatedNetwork {
        network,
        created_run_dir: state
            .get("NODE_NETNS_CREATED_RUN_DIR")
            .is_some_and(|v| v == "true"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_node_network_is_read_back() {
        let network = NodeNetwork::project();
        let state = parse_state(
            "NODE_NETNS=pod-checkpointer-node\nNODE_HOST_LINK=pckpt-host\nNODE_HOST_IP=10.213.0.1\n\
             NODE_IP=10.213.0.2\nPOD_CIDR=10.213.1.0/24\nNODE_NETNS_CREATED_RUN_DIR=true\n",
        );
        let created = parse_network(&state).unwrap();
        assert_eq!(created.network, network);
        assert!(created.created_run_dir);
        assert!(parse_network(&parse_state("WORKDIR=/w\n")).is_none());
    }
}

/// Runs the real binaries: `cargo xtask e2e-env build`, then
/// `cargo test -p ckpt-e2e -- --ignored control_plane_lifecycle`.
#[cfg(test)]
mod lifecycle_tests {
    use super::*;
    use crate::e2e_env::build::BinDir;
    use crate::process::is_alive;

    #[test]
    #[ignore = "needs `cargo xtask e2e-env build` and free ports 22379-22380, 16443"]
    fn control_plane_lifecycle() {
        let options = StartOptions {
            etcd_port: 22379,
            apiserver_port: 16443,
            ..StartOptions::new(BinDir::cached().unwrap())
        };
        let mut plane = ControlPlane::start(&options).unwrap();
        assert_eq!(plane.api_get("/readyz").unwrap().0, 200);
        let (status, _) = plane.api_get("/api/v1/namespaces/default").unwrap();
        assert_eq!(status, 200);

        plane.pause_apiserver().unwrap();
        assert_eq!(
            plane.api_get("/readyz").unwrap().0,
            0,
            "a paused API server answers nothing"
        );
        plane.resume_apiserver().unwrap();
        assert_eq!(plane.api_get("/readyz").unwrap().0, 200);

        let old_pid = plane.apiserver_pid().unwrap();
        plane.kill_apiserver().unwrap();
        assert!(!is_alive(old_pid));
        plane.restart_apiserver().unwrap();
        assert_ne!(plane.apiserver_pid(), Some(old_pid));
        assert_eq!(
            plane.api_get("/api/v1/namespaces/default").unwrap().0,
            200,
            "etcd data survived"
        );

        let pids = [plane.etcd_pid().unwrap(), plane.apiserver_pid().unwrap()];
        let workdir = plane.workdir().to_owned();
        drop(plane);
        assert!(pids.iter().all(|pid| !is_alive(*pid)), "Drop stops the processes");
        assert!(!workdir.exists(), "Drop removes the work dir");
    }
}
