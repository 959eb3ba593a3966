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
//! `kcm-flex-volumes/`, and with a real node `node/` (see [`RealNode`](super::RealNode)).

use std::collections::BTreeMap;
use std::fs;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};

use super::build::BinDir;
use super::node_network::NodeNetwork;
use super::process::{Managed, in_path, log_tail_section, proc_state, random_hex};
use super::{PROGRESS, human_duration};
use crate::harness::wait::{Probe, TimedOut, wait_for};

/// The node the hollow kubelet registers, and whose identity `kubeconfig-node-1` carries.
pub const NODE_NAME: &str = "node-1";

/// kubemark 1.20 hard-codes its fake CRI (runtime.v1alpha2) socket: one hollow node per machine.
pub const CRI_SOCKET: &str = "/tmp/kubelet_remote.sock";

/// kubemark 1.20 always puts the kubelet's root dir at `/tmp/hollow-kubelet.NNN`.
const HOLLOW_ROOT_PREFIX: &str = "/tmp/hollow-kubelet.";

const STATE_FILE: &str = "e2e-env.state";
const ETCD_PID_FILE: &str = "etcd.pid";
const APISERVER_PID_FILE: &str = "apiserver.pid";
const HOLLOW_PID_FILE: &str = "hollow-node.pid";
const CONTROLLER_MANAGER_PID_FILE: &str = "controller-manager.pid";
const SCHEDULER_PID_FILE: &str = "scheduler.pid";
const CONTROLLER_MANAGER_LOG: &str = "controller-manager.log";
const SCHEDULER_LOG: &str = "scheduler.log";
const AUDIT_POLICY_FILE: &str = "audit-policy.yaml";
const AUDIT_LOG_FILE: &str = "audit.log";

/// The user of `kubeconfig-agent`, the only one whose requests are audited.
pub const AGENT_USER: &str = "pod-checkpointer";
/// The users a self-hosted kube-controller-manager and kube-scheduler authenticate as.
pub const CONTROLLER_MANAGER_USER: &str = "system:kube-controller-manager";
pub const SCHEDULER_USER: &str = "system:kube-scheduler";

/// Audits every request of `user` at `Metadata` level (verb, URI, status; no bodies) and
/// nothing else, so `cargo xtask bench` can count the agent's API load without slowing the API
/// server down with everybody else's requests. `RequestReceived` is omitted: one event per
/// request, plus `ResponseStarted` for watches.
fn audit_policy(user: &str) -> String {
    format!(
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n\
         - level: Metadata\n  users: [{user}]\n- level: None\n",
        user = yaml_string(user)
    )
}

const ETCD_READY_TIMEOUT: Duration = Duration::from_secs(20);
const APISERVER_READY_TIMEOUT: Duration = Duration::from_secs(60);
const NODE_READY_TIMEOUT: Duration = Duration::from_secs(90);
const CONTROLLERS_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long etcd and the hollow node get to exit on SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(10);

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
    /// Also run kube-controller-manager and kube-scheduler (host network, admin identity),
    /// with ServiceAccount admission and bound service-account tokens on the API server.
    pub controllers: bool,
    /// kube-controller-manager's and kube-scheduler's HTTPS ports (health only) on 127.0.0.1.
    pub controller_manager_port: u16,
    pub scheduler_port: u16,
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
            controllers: false,
            controller_manager_port: 20257,
            scheduler_port: 20259,
        }
    }

    /// The plane a [`RealNode`](super::RealNode) joins: the project's node network, the
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

    /// Where the API server listens: the host end of the node network, or loopback.
    fn bind_ip(&self) -> Ipv4Addr {
        self.node_network
            .as_ref()
            .map_or(Ipv4Addr::LOCALHOST, |network| network.host_ip)
    }
}

/// A running (or partly started) control plane. Dropping it stops everything it started and
/// removes the work dir, unless it was [`detach`](ControlPlane::detach)ed or
/// [`attach`](ControlPlane::attach)ed.
pub struct ControlPlane {
    workdir: PathBuf,
    apiserver_bin: PathBuf,
    etcd_port: u16,
    apiserver_port: u16,
    /// 127.0.0.1, or the host end of the node network.
    bind_ip: Ipv4Addr,
    /// Whether the API server admits service accounts (the controllers run).
    service_accounts: bool,
    etcd: Option<Managed>,
    apiserver: Option<Managed>,
    hollow: Option<HollowNode>,
    controller_manager: Option<Managed>,
    scheduler: Option<Managed>,
    network: Option<CreatedNetwork>,
    stop_on_drop: bool,
    stopped: bool,
}

/// The node network this plane created, and whether creating it created `/run/netns` too.
struct CreatedNetwork {
    network: NodeNetwork,
    created_run_dir: bool,
}

struct HollowNode {
    process: Managed,
    /// The kubemark binary, to start it again.
    kubemark: PathBuf,
    kubelet_port: u16,
    kubelet_read_only_port: u16,
    /// `/tmp/hollow-kubelet.NNN`, once read from its log.
    root_dir: Option<PathBuf>,
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver (and the hollow node if asked) and waits until they are
    /// ready. On failure everything started so far is stopped and the error carries the tail
    /// of the failing log.
    pub fn start(options: &StartOptions) -> anyhow::Result<ControlPlane> {
        let started = Instant::now();
        preflight(options)?;
        let workdir = create_workdir(options.workdir.as_deref())?;
        PROGRESS.say(&format!("work dir {}", workdir.display()));
        // From here on, Drop cleans up whatever fails.
        let mut plane = ControlPlane {
            workdir,
            apiserver_bin: options.bins.kube_apiserver(),
            etcd_port: options.etcd_port,
            apiserver_port: options.apiserver_port,
            bind_ip: options.bind_ip(),
            service_accounts: options.controllers,
            etcd: None,
            apiserver: None,
            hollow: None,
            controller_manager: None,
            scheduler: None,
            network: None,
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
        plane.start_etcd()?;
        plane.write_credentials()?;
        plane.spawn_apiserver()?;
        let ready_after = plane.wait_apiserver_ready()?;
        PROGRESS.say(&format!(
            "kube-apiserver ready at {} after {} (total {})",
            plane.apiserver_url(),
            human_duration(ready_after),
            human_duration(started.elapsed())
        ));
        if options.controllers {
            plane.start_controllers(options)?;
        }
        if options.hollow_node {
            plane.start_hollow_node(options)?;
        }
        plane.write_state()?;
        PROGRESS.say(&format!(
            "control plane up in {}",
            human_duration(started.elapsed())
        ));
        Ok(plane)
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
        let bind_ip = network
            .as_ref()
            .map_or(Ipv4Addr::LOCALHOST, |created| created.network.host_ip);
        Ok(ControlPlane {
            workdir: workdir.to_owned(),
            apiserver_bin: PathBuf::from(get("KUBE_APISERVER_BIN")?),
            etcd_port: port("ETCD_PORT")?,
            apiserver_port: port("APISERVER_PORT")?,
            bind_ip,
            service_accounts: state.get("SERVICE_ACCOUNTS").is_some_and(|v| v == "true"),
            etcd: read_pid(ETCD_PID_FILE).map(|pid| attach("etcd", pid, "etcd.log")),
            apiserver: read_pid(APISERVER_PID_FILE).map(|pid| attach("kube-apiserver", pid, "apiserver.log")),
            hollow,
            controller_manager: read_pid(CONTROLLER_MANAGER_PID_FILE)
                .map(|pid| attach("kube-controller-manager", pid, CONTROLLER_MANAGER_LOG)),
            scheduler: read_pid(SCHEDULER_PID_FILE).map(|pid| attach("kube-scheduler", pid, SCHEDULER_LOG)),
            network,
            stop_on_drop: false,
            stopped: false,
        })
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
        self.workdir.join(format!("kubeconfig-{NODE_NAME}"))
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

    /// `https://127.0.0.1:PORT`, or with a node network `https://<host end of the veth>:PORT`.
    pub fn apiserver_url(&self) -> String {
        format!("https://{}:{}", self.bind_ip, self.apiserver_port)
    }

    /// The node network the plane created, if it was started with one.
    pub fn node_network(&self) -> Option<&NodeNetwork> {
        self.network.as_ref().map(|created| &created.network)
    }

    pub fn apiserver_port(&self) -> u16 {
        self.apiserver_port
    }

    pub fn etcd_port(&self) -> u16 {
        self.etcd_port
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
        let apiserver = self.apiserver_mut()?;
        apiserver.terminate("KILL", Duration::from_secs(10))?;
        PROGRESS.say("kube-apiserver killed");
        Ok(())
    }

    /// SIGSTOPs the API server: it keeps its port, accepts connections and answers nothing.
    pub fn pause_apiserver(&mut self) -> anyhow::Result<()> {
        let apiserver = self.apiserver_mut()?;
        apiserver.ensure_running("cannot pause kube-apiserver")?;
        apiserver.signal("STOP")?;
        let pid = apiserver.pid();
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
        let apiserver = self.apiserver_mut()?;
        apiserver.ensure_running("cannot resume kube-apiserver")?;
        apiserver.signal("CONT")?;
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
        }
    }

    fn apiserver_mut(&mut self) -> anyhow::Result<&mut Managed> {
        self.apiserver.as_mut().context("no kube-apiserver was started")
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
        let mut command = Command::new("etcd");
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
        let etcd = self.etcd.insert(etcd);
        let health = format!("{client}/health");
        let log = etcd.log().to_owned();
        let ((), took) = wait_ready("etcd /health 200", ETCD_READY_TIMEOUT, &log, || {
            etcd.ensure_running(&format!("etcd failed (port {} busy?)", self.etcd_port))?;
            Ok(http_probe(http_status(&health, &[])))
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
        let node_ip = self.node_network().map(|network| network.node_ip);
        write_pki(&self.workdir.join("certs"), &serving_names(self.bind_ip, node_ip))?;
        let sa_key = self.service_account_key();
        openssl(&["genrsa", "-out", &sa_key.to_string_lossy(), "2048"])?;

        let identities = [
            Identity {
                token: random_hex(16)?,
                user: "admin".into(),
                uid: "uid-admin".into(),
                groups: vec!["system:masters".into()],
            },
            Identity {
                token: random_hex(16)?,
                user: format!("system:node:{NODE_NAME}"),
                uid: format!("uid-{NODE_NAME}"),
                groups: vec!["system:nodes".into()],
            },
            Identity {
                token: random_hex(16)?,
                user: AGENT_USER.into(),
                uid: "uid-agent".into(),
                groups: vec![],
            },
            // A self-hosted controller-manager acts for every controller with its own
            // credentials (no per-controller service accounts), so it needs every right.
            Identity {
                token: random_hex(16)?,
                user: CONTROLLER_MANAGER_USER.into(),
                uid: "uid-kcm".into(),
                groups: vec!["system:masters".into()],
            },
            // The bootstrap RBAC policy's role for the scheduler names this user.
            Identity {
                token: random_hex(16)?,
                user: SCHEDULER_USER.into(),
                uid: "uid-scheduler".into(),
                groups: vec![],
            },
        ];
        fs::write(self.workdir.join("tokens.csv"), render_tokens_csv(&identities))?;
        fs::write(self.workdir.join(AUDIT_POLICY_FILE), audit_policy(AGENT_USER))?;
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
        Ok(())
    }

    fn spawn_apiserver(&mut self) -> anyhow::Result<()> {
        let mut command = Command::new(&self.apiserver_bin);
        command.args(apiserver_args(&ApiserverFlags {
            workdir: &self.workdir,
            etcd_port: self.etcd_port,
            apiserver_port: self.apiserver_port,
            bind_ip: self.bind_ip,
            service_accounts: self.service_accounts,
        }));
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
        let mut kcm = Command::new(options.bins.kube_controller_manager());
        kcm.args(controller_manager_args(
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
        let mut scheduler = Command::new(options.bins.kube_scheduler());
        scheduler.args(scheduler_args(&kubeconfig, options.scheduler_port));
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
                    Ok(http_probe(http_status(&healthz, &["--insecure"])))
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
        let mut command = Command::new(&kubemark);
        command
            .args(["--morph=kubelet", &format!("--name={NODE_NAME}")])
            .arg(format!("--kubeconfig={}", self.node_kubeconfig().display()))
            .arg(format!("--kubelet-port={kubelet_port}"))
            .arg(format!("--kubelet-read-only-port={kubelet_read_only_port}"));
        let log = self.workdir.join(hollow_log_name());
        let process = Managed::spawn("hollow node", &mut command, &log, &self.workdir)?;
        self.write_pid(HOLLOW_PID_FILE, process.pid())?;
        self.hollow = Some(HollowNode {
            process,
            kubemark,
            kubelet_port,
            kubelet_read_only_port,
            root_dir: None,
        });
        self.write_state()?;
        let hollow = self.hollow.as_mut().context("hollow node vanished")?;

        let (root, _) = wait_ready(
            "hollow kubelet root dir in its log",
            Duration::from_secs(30),
            &log,
            || {
                hollow
                    .process
                    .ensure_running("hollow node did not become Ready")?;
                let root = fs::read_to_string(&log)
                    .ok()
                    .and_then(|text| parse_hollow_root(&text));
                Ok(root.map_or_else(|| Probe::Waiting("not logged yet".into()), Probe::Ready))
            },
        )?;
        hollow.root_dir = Some(root.clone());
        let real_static_dir = fs::read_dir(&root)
            .with_context(|| format!("cannot read {}", root.display()))?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.is_dir()
                    && p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("static-pods"))
            })
            .with_context(|| format!("no static-pods* dir in {}", root.display()))?;
        let link = self.workdir.join("static-pods");
        std::os::unix::fs::symlink(&real_static_dir, &link)
            .with_context(|| format!("cannot link {} to {}", link.display(), real_static_dir.display()))?;
        self.write_state()?;

        let api = self.api();
        let hollow = self.hollow.as_mut().context("hollow node vanished")?;
        let node_path = format!("/api/v1/nodes/{NODE_NAME}");
        let ((), took) = wait_ready(
            &format!("Node {NODE_NAME} Ready"),
            NODE_READY_TIMEOUT,
            &log,
            || {
                hollow
                    .process
                    .ensure_running("hollow node did not become Ready")?;
                Ok(match api.get(&node_path)? {
                    (200, body) if node_is_ready(&body) => Probe::Ready(()),
                    (200, _) => Probe::Waiting("the Node is not Ready".into()),
                    (status, _) => Probe::Waiting(format!("HTTP {status}")),
                })
            },
        )?;
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
        // A real node in the work dir goes first: its kubelet talks to the API server, and its
        // mount namespace pins files in the work dir.
        if let Err(e) = super::real_node::stop_in(&self.workdir) {
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
                    // Only a socket nobody answers on is ours to remove.
                    if UnixStream::connect(CRI_SOCKET).is_err() {
                        let _ = fs::remove_file(CRI_SOCKET);
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

fn hollow_log_name() -> String {
    format!("hollow-{NODE_NAME}.log")
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

/// Fails early, before anything is started: missing commands, busy ports, a running hollow node.
fn preflight(options: &StartOptions) -> anyhow::Result<()> {
    for command in ["etcd", "openssl", "curl"] {
        anyhow::ensure!(
            in_path(command),
            "{command} is not installed: run `cargo xtask e2e-env build`"
        );
    }
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
fn create_workdir(wanted: Option<&Path>) -> anyhow::Result<PathBuf> {
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

/// [`wait_for`] a process to become ready; giving up adds the tail of its `log`.
pub(crate) fn wait_ready<T>(
    what: &str,
    timeout: Duration,
    log: &Path,
    probe: impl FnMut() -> anyhow::Result<Probe<T>>,
) -> anyhow::Result<(T, Duration)> {
    wait_for(what, timeout, probe).map_err(|e| match e.downcast::<TimedOut>() {
        Ok(timed_out) => anyhow!("{timed_out}\n{}", log_tail_section(log, 30)),
        Err(e) => e,
    })
}

/// Ready on HTTP 200; otherwise what was answered (0: nothing within 5 s).
pub(crate) fn http_probe(status: u16) -> Probe<()> {
    match status {
        200 => Probe::Ready(()),
        status => Probe::Waiting(format!("HTTP {status}")),
    }
}

/// The API server as one identity, reached with curl (installed by the build step).
#[derive(Clone, Debug)]
pub(crate) struct ApiEndpoint {
    pub(crate) url: String,
    pub(crate) ca: PathBuf,
    pub(crate) token: String,
}

impl ApiEndpoint {
    fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        self.get_within(path, CURL_TIMEOUT)
    }

    /// `GET path` within `timeout`: the HTTP status (0 when it cannot connect or times out)
    /// and the body.
    pub(crate) fn get_within(&self, path: &str, timeout: Duration) -> anyhow::Result<(u16, String)> {
        let ca = self.ca.display().to_string();
        let auth = format!("Authorization: Bearer {}", self.token);
        // Not curl's own User-Agent: the API server pretty-prints JSON for curl.
        let args = [
            "--cacert",
            &ca,
            "-H",
            &auth,
            "-H",
            "User-Agent: pod-checkpointer-xtask",
        ];
        let output = curl(&format!("{}{path}", self.url), &args, timeout)?;
        Ok(split_status(&output))
    }
}

/// How long a curl request may take, unless said otherwise.
const CURL_TIMEOUT: Duration = Duration::from_secs(5);

/// The HTTP status of `GET url` (0 when it cannot connect or times out).
pub(crate) fn http_status(url: &str, args: &[&str]) -> u16 {
    curl(url, args, CURL_TIMEOUT)
        .map(|out| split_status(&out).0)
        .unwrap_or(0)
}

/// `curl -s URL` within `timeout`, with the status code appended on a line of its own.
fn curl(url: &str, args: &[&str], timeout: Duration) -> anyhow::Result<String> {
    let output = Command::new("curl")
        .args(["-s", "-w", "\n%{http_code}", "--max-time"])
        .arg(format!("{:.3}", timeout.as_secs_f64()))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .context("cannot run curl")?;
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Splits curl's output into the status code (its last line) and the body.
fn split_status(output: &str) -> (u16, String) {
    match output.rsplit_once('\n') {
        Some((body, code)) => (code.trim().parse().unwrap_or(0), body.to_owned()),
        None => (output.trim().parse().unwrap_or(0), String::new()),
    }
}

/// What kube-apiserver's flags depend on.
struct ApiserverFlags<'a> {
    workdir: &'a Path,
    etcd_port: u16,
    apiserver_port: u16,
    bind_ip: Ipv4Addr,
    service_accounts: bool,
}

/// kube-apiserver's flags: the recipe's, which stand in for a missing controller-manager, or
/// with the controllers ServiceAccount admission and bound tokens.
fn apiserver_args(flags: &ApiserverFlags<'_>) -> Vec<String> {
    let w = flags.workdir.display();
    let mut args = vec![
        format!("--etcd-servers=http://127.0.0.1:{}", flags.etcd_port),
        // The serving cert names this address (see `serving_names`).
        format!("--bind-address={}", flags.bind_ip),
        format!("--advertise-address={}", flags.bind_ip),
        format!("--secure-port={}", flags.apiserver_port),
        format!("--tls-cert-file={w}/certs/apiserver.crt"),
        format!("--tls-private-key-file={w}/certs/apiserver.key"),
        format!("--token-auth-file={w}/tokens.csv"),
        "--authorization-mode=Node,RBAC".into(),
        "--enable-admission-plugins=NodeRestriction".into(),
    ];
    if flags.service_accounts {
        // Pods get projected tokens the kubelet requests (TokenRequest) and refreshes, and
        // kube-root-ca.crt for the CA, as from 1.21 on; 1.20 has this behind an alpha gate.
        args.push("--feature-gates=BoundServiceAccountTokenVolume=true".into());
        // A real kubelet reports its InternalIP (the node end of the veth) and a hostname
        // that does not resolve: logs and exec must use the former (wall 3).
        args.push("--kubelet-preferred-address-types=InternalIP,Hostname".into());
    } else {
        // No controller-manager creates ServiceAccounts, so Pod admission would fail.
        args.push("--disable-admission-plugins=ServiceAccount".into());
    }
    args.extend([
        format!("--service-account-key-file={w}/sa.key"),
        format!("--service-account-signing-key-file={w}/sa.key"),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
        "--service-cluster-ip-range=10.96.0.0/16".into(),
        // Loopback addresses are invalid in Endpoints, and nothing here needs that object.
        "--endpoint-reconciler-type=none".into(),
        "--allow-privileged=true".into(),
        format!("--audit-policy-file={w}/{AUDIT_POLICY_FILE}"),
        format!("--audit-log-path={w}/{AUDIT_LOG_FILE}"),
    ]);
    args
}

/// kube-controller-manager's flags: every default controller but the legacy token Secrets
/// (pods get bound tokens), acting as admin; nothing written outside the work dir.
fn controller_manager_args(workdir: &Path, kubeconfig: &Path, ca: &Path, port: u16) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        "--port=0".into(),
        // On a Lease: a self-hosted copy (see `crate::self_hosted`) waits on it while this
        // one runs, instead of acting beside it.
        "--leader-elect=true".into(),
        "--leader-elect-resource-lock=leases".into(),
        "--use-service-account-credentials=false".into(),
        "--controllers=*,-serviceaccount-token".into(),
        // Published in every namespace as kube-root-ca.crt, the CA of the projected volumes.
        format!("--root-ca-file={}", ca.display()),
        "--feature-gates=BoundServiceAccountTokenVolume=true".into(),
        // Its default is under /usr/libexec, which it would create.
        format!("--flex-volume-plugin-dir={}/kcm-flex-volumes", workdir.display()),
    ]
}

fn scheduler_args(kubeconfig: &Path, port: u16) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        "--port=0".into(),
        "--leader-elect=true".into(),
        "--leader-elect-resource-lock=leases".into(),
    ]
}

/// What the API server's serving certificate names: `bind_ip`, loopback, the first service
/// address, the node's address if there is a node, and the in-cluster names.
fn serving_names(bind_ip: Ipv4Addr, node_ip: Option<Ipv4Addr>) -> Vec<String> {
    let mut ips = vec![bind_ip, Ipv4Addr::LOCALHOST, Ipv4Addr::new(10, 96, 0, 1)];
    ips.extend(node_ip);
    ips.dedup();
    let dns = [
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ];
    ips.iter()
        .map(|ip| format!("IP:{ip}"))
        .chain(dns.iter().map(|name| format!("DNS:{name}")))
        .collect()
}

/// `ca.{crt,key}` and `apiserver.{crt,key}` (signed by that CA for `names`) in `dir`.
fn write_pki(dir: &Path, names: &[String]) -> anyhow::Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let dir = dir
        .to_str()
        .with_context(|| format!("{} is not UTF-8", dir.display()))?;
    let extensions = format!("{dir}/apiserver.ext");
    fs::write(
        &extensions,
        format!(
            "subjectAltName={}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
            names.join(",")
        ),
    )?;
    let [ca_key, ca_crt, key, csr, crt] = [
        "ca.key",
        "ca.crt",
        "apiserver.key",
        "apiserver.csr",
        "apiserver.crt",
    ]
    .map(|f| format!("{dir}/{f}"));
    let days = "3650";
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        &ca_key,
        "-out",
        &ca_crt,
        "-days",
        days,
        "-subj",
        "/CN=pod-checkpointer-e2e-ca",
    ])?;
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        &key,
        "-out",
        &csr,
        "-subj",
        "/CN=kube-apiserver",
    ])?;
    openssl(&[
        "x509",
        "-req",
        "-in",
        &csr,
        "-CA",
        &ca_crt,
        "-CAkey",
        &ca_key,
        "-CAcreateserial",
        "-out",
        &crt,
        "-days",
        days,
        "-extfile",
        &extensions,
    ])
}

/// `openssl ARGS…`; its stderr is in the error.
fn openssl(args: &[&str]) -> anyhow::Result<()> {
    let output = Command::new("openssl")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("cannot run openssl")?;
    anyhow::ensure!(
        output.status.success(),
        "openssl {} failed ({}): {}",
        args.first().copied().unwrap_or_default(),
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(())
}

/// One line of the API server's static token file.
struct Identity {
    token: String,
    user: String,
    uid: String,
    groups: Vec<String>,
}

/// `token,user,uid[,"group1,group2"]` lines for `--token-auth-file`.
fn render_tokens_csv(identities: &[Identity]) -> String {
    identities
        .iter()
        .map(|id| {
            let groups = if id.groups.is_empty() {
                String::new()
            } else {
                format!(",\"{}\"", id.groups.join(","))
            };
            format!("{},{},{}{groups}\n", id.token, id.user, id.uid)
        })
        .collect()
}

/// The token of `user` in a token file.
fn token_of(tokens_csv: &str, user: &str) -> Option<String> {
    tokens_csv.lines().find_map(|line| {
        let mut fields = line.split(',');
        let token = fields.next()?;
        (fields.next()? == user).then(|| token.to_owned())
    })
}

/// A kubeconfig with one cluster, one token user and one context, all selected.
pub fn render_kubeconfig(server: &str, ca: &Path, user: &str, token: &str) -> String {
    let ca = ca.display().to_string();
    format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: e2e\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\n\
         users:\n\
         - name: {user}\n  user:\n    token: {token}\n\
         contexts:\n\
         - name: e2e\n  context:\n    cluster: e2e\n    user: {user}\n\
         current-context: e2e\n",
        server = yaml_string(server),
        ca = yaml_string(&ca),
        user = yaml_string(user),
        token = yaml_string(token),
    )
}

/// A double-quoted YAML scalar.
fn yaml_string(value: &str) -> String {
    format!("\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\""))
}

/// `KEY=VALUE` lines into a map; other lines are ignored.
pub(crate) fn parse_state(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.to_owned()))
        .collect()
}

/// Removes a hollow kubelet's root dir (only one named like kubemark's). The kubelet
/// bind-mounts it on itself (to make it shared) and may mount pod volumes below: removing
/// it without unmounting failed with EBUSY and left a mount behind after every run.
fn remove_hollow_root(root: &Path) -> anyhow::Result<()> {
    if !root.to_string_lossy().starts_with(HOLLOW_ROOT_PREFIX) {
        return Ok(());
    }
    unmount_below(root)?;
    match fs::remove_dir_all(root) {
        Err(e) if root.exists() => Err(anyhow!("cannot remove {}: {e}", root.display())),
        _ => Ok(()),
    }
}

/// Unmounts every mount at `dir` or below it, deepest first (lazily if busy).
fn unmount_below(dir: &Path) -> anyhow::Result<()> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").context("cannot read /proc/self/mountinfo")?;
    let mut points = mount_points_below(&mountinfo, dir);
    points.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    for point in points {
        let plain = Command::new("umount").arg(&point).stderr(Stdio::null()).status();
        if !plain.is_ok_and(|status| status.success()) {
            super::process::run_command(Command::new("umount").arg("-l").arg(&point))
                .with_context(|| format!("cannot unmount {}", point.display()))?;
        }
    }
    Ok(())
}

/// The mount points in `mountinfo` (`/proc/self/mountinfo`) at `dir` or below it, as
/// often as something is mounted there (stacked mounts need as many unmounts).
fn mount_points_below(mountinfo: &str, dir: &Path) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| PathBuf::from(super::node_network::unescape_mountinfo(field)))
        .filter(|point| point.starts_with(dir))
        .collect()
}

/// The root dir from kubemark's `Using /tmp/hollow-kubelet.NNN as root dir for hollow-kubelet`.
fn parse_hollow_root(log: &str) -> Option<PathBuf> {
    log.lines().find_map(|line| {
        let (before, _) = line.split_once(" as root dir for hollow-kubelet")?;
        let (_, dir) = before.rsplit_once("Using ")?;
        Some(PathBuf::from(dir.trim()))
    })
}

/// Whether a Node's JSON has the condition `Ready` = `True` (the API server writes struct
/// fields in order, `type` then `status`; whitespace is ignored for pretty output).
pub(crate) fn node_is_ready(node_json: &str) -> bool {
    let compact: String = node_json.chars().filter(|c| !c.is_whitespace()).collect();
    compact.contains(r#"{"type":"Ready","status":"True""#)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(token: &str, user: &str, uid: &str, groups: &[&str]) -> Identity {
        Identity {
            token: token.into(),
            user: user.into(),
            uid: uid.into(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        }
    }

    #[test]
    fn mounts_below_the_hollow_kubelets_root_are_found() {
        let mountinfo = "\
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
45 27 254:0 /tmp/hollow-kubelet.29 /tmp/hollow-kubelet.29 rw,relatime shared:1 - ext4 /dev/vda rw
46 27 254:0 /tmp/hollow-kubelet.291 /tmp/hollow-kubelet.291 rw,relatime shared:2 - ext4 /dev/vda rw
47 45 0:50 / /tmp/hollow-kubelet.29/pods/a\\040b/volumes rw,relatime shared:3 - tmpfs tmpfs rw
48 45 254:0 /tmp/hollow-kubelet.29 /tmp/hollow-kubelet.29 rw,relatime shared:1 - ext4 /dev/vda rw
";
        let check = |dir: &str, expected: &[&str]| {
            let found = mount_points_below(mountinfo, Path::new(dir));
            let expected: Vec<PathBuf> = expected.iter().map(PathBuf::from).collect();
            assert_eq!(found, expected, "{dir}");
        };
        check(
            "/tmp/hollow-kubelet.29",
            &[
                "/tmp/hollow-kubelet.29",
                "/tmp/hollow-kubelet.29/pods/a b/volumes",
                "/tmp/hollow-kubelet.29",
            ],
        );
        check("/tmp/hollow-kubelet.291", &["/tmp/hollow-kubelet.291"]);
        check("/tmp/hollow-kubelet.2", &[]);
    }

    #[test]
    fn tokens_csv_has_one_line_per_identity_with_quoted_groups() {
        let csv = render_tokens_csv(&[
            identity("t1", "admin", "uid-admin", &["system:masters"]),
            identity(
                "t2",
                "system:node:node-1",
                "uid-node-1",
                &["system:nodes", "extra"],
            ),
            identity("t3", "pod-checkpointer", "uid-agent", &[]),
        ]);
        assert_eq!(
            csv,
            "t1,admin,uid-admin,\"system:masters\"\n\
             t2,system:node:node-1,uid-node-1,\"system:nodes,extra\"\n\
             t3,pod-checkpointer,uid-agent\n"
        );
        assert_eq!(token_of(&csv, "admin").as_deref(), Some("t1"));
        assert_eq!(token_of(&csv, "pod-checkpointer").as_deref(), Some("t3"));
        assert_eq!(token_of(&csv, "nobody"), None);
    }

    #[test]
    fn kubeconfig_names_server_ca_and_token() {
        let config = render_kubeconfig(
            "https://127.0.0.1:6443",
            Path::new("/w/certs/apiserver.crt"),
            "admin",
            "abc\"d",
        );
        assert_eq!(
            config,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: \"https://127.0.0.1:6443\"\n    \
             certificate-authority: \"/w/certs/apiserver.crt\"\nusers:\n- name: \"admin\"\n  user:\n    token: \"abc\\\"d\"\n\
             contexts:\n- name: e2e\n  context:\n    cluster: e2e\n    user: \"admin\"\ncurrent-context: e2e\n"
        );
    }

    #[test]
    fn apiserver_args_point_into_the_workdir() {
        let flags = ApiserverFlags {
            workdir: Path::new("/w"),
            etcd_port: 22379,
            apiserver_port: 16443,
            bind_ip: Ipv4Addr::LOCALHOST,
            service_accounts: false,
        };
        let args = apiserver_args(&flags);
        assert!(args.contains(&"--etcd-servers=http://127.0.0.1:22379".to_owned()));
        assert!(args.contains(&"--bind-address=127.0.0.1".to_owned()));
        assert!(args.contains(&"--disable-admission-plugins=ServiceAccount".to_owned()));
        assert!(args.contains(&"--secure-port=16443".to_owned()));
        assert!(args.contains(&"--tls-cert-file=/w/certs/apiserver.crt".to_owned()));
        assert!(args.contains(&"--tls-private-key-file=/w/certs/apiserver.key".to_owned()));
        assert!(args.contains(&"--token-auth-file=/w/tokens.csv".to_owned()));
        assert!(args.contains(&"--audit-log-path=/w/audit.log".to_owned()));
        assert_eq!(
            audit_policy("pod-checkpointer"),
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n\
             - level: Metadata\n  users: [\"pod-checkpointer\"]\n- level: None\n"
        );
    }

    #[test]
    fn with_the_controllers_pods_get_service_accounts_and_bound_tokens() {
        let flags = ApiserverFlags {
            workdir: Path::new("/w"),
            etcd_port: 12379,
            apiserver_port: 17443,
            bind_ip: Ipv4Addr::new(10, 213, 0, 1),
            service_accounts: true,
        };
        let args = apiserver_args(&flags);
        assert!(args.contains(&"--bind-address=10.213.0.1".to_owned()));
        assert!(args.contains(&"--advertise-address=10.213.0.1".to_owned()));
        assert!(args.contains(&"--feature-gates=BoundServiceAccountTokenVolume=true".to_owned()));
        assert!(!args.iter().any(|a| a.starts_with("--disable-admission-plugins")));
        let kcm = controller_manager_args(
            Path::new("/w"),
            Path::new("/w/kubeconfig"),
            Path::new("/w/certs/apiserver.crt"),
            20257,
        );
        assert!(kcm.contains(&"--root-ca-file=/w/certs/apiserver.crt".to_owned()));
        assert!(kcm.contains(&"--controllers=*,-serviceaccount-token".to_owned()));
        assert!(kcm.contains(&"--flex-volume-plugin-dir=/w/kcm-flex-volumes".to_owned()));
        assert_eq!(
            scheduler_args(Path::new("/w/kubeconfig"), 20259),
            [
                "--kubeconfig=/w/kubeconfig",
                "--bind-address=127.0.0.1",
                "--secure-port=20259",
                "--port=0",
                "--leader-elect=true",
                "--leader-elect-resource-lock=leases"
            ]
        );
    }

    #[test]
    fn the_serving_cert_names_the_host_the_node_and_the_service() {
        assert_eq!(
            serving_names(Ipv4Addr::new(10, 213, 0, 1), Some(Ipv4Addr::new(10, 213, 0, 2))),
            [
                "IP:10.213.0.1",
                "IP:127.0.0.1",
                "IP:10.96.0.1",
                "IP:10.213.0.2",
                "DNS:localhost",
                "DNS:kubernetes",
                "DNS:kubernetes.default",
                "DNS:kubernetes.default.svc",
                "DNS:kubernetes.default.svc.cluster.local"
            ]
        );
        let loopback = serving_names(Ipv4Addr::LOCALHOST, None);
        assert_eq!(loopback[..2], ["IP:127.0.0.1", "IP:10.96.0.1"]);
    }

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

    #[test]
    fn state_lines_parse_into_a_map() {
        let state = parse_state("WORKDIR=/tmp/x\nSTATIC_POD_DIR=\nnoise\nAPISERVER_URL=https://a=b\n");
        assert_eq!(state["WORKDIR"], "/tmp/x");
        assert_eq!(state["STATIC_POD_DIR"], "");
        assert_eq!(state["APISERVER_URL"], "https://a=b");
        assert_eq!(state.len(), 3);
    }

    #[test]
    fn hollow_root_is_read_from_the_kubemark_log() {
        let log = "I1202 12:00:00.1 1 flags.go:59] FLAG: --v=\"2\"\n\
                   I1202 12:00:00.2 1 hollow_kubelet.go:142] Using /tmp/hollow-kubelet.123456 as root dir for hollow-kubelet\n";
        assert_eq!(
            parse_hollow_root(log),
            Some(PathBuf::from("/tmp/hollow-kubelet.123456"))
        );
        assert_eq!(parse_hollow_root("nothing yet\n"), None);
    }

    #[test]
    fn node_readiness_comes_from_the_ready_condition() {
        let ready = r#"{"status":{"conditions":[{"type":"MemoryPressure","status":"False"},{"type":"Ready","status":"True","reason":"KubeletReady"}]}}"#;
        let not_ready = r#"{"status":{"conditions":[{"type":"Ready","status":"False"}]}}"#;
        let pretty = "{\n  \"type\": \"Ready\",\n  \"status\": \"True\"\n}";
        assert!(node_is_ready(ready));
        assert!(!node_is_ready(not_ready));
        assert!(node_is_ready(pretty));
    }

    #[test]
    fn curl_output_splits_into_status_and_body() {
        assert_eq!(split_status("ok\n200"), (200, "ok".to_owned()));
        assert_eq!(split_status("\n000"), (0, String::new()));
        assert_eq!(
            split_status("{\"a\":1}\nline2\n404"),
            (404, "{\"a\":1}\nline2".to_owned())
        );
    }
}

/// Runs the real binaries: `cargo xtask e2e-env build`, then
/// `cargo test -p ckpt-e2e -- --ignored control_plane_lifecycle`.
#[cfg(test)]
mod lifecycle_tests {
    use super::*;
    use crate::e2e_env::process::is_alive;

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
