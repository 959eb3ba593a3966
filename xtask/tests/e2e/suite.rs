//! The suite's shared state ([`Suite`]: the control plane, kubectl as admin, the hollow
//! kubelet's CRI, the agent binary) and each scenario's context ([`Scenario`]: its namespace
//! and dirs, step narration, the objects and expectations scenarios share, the report of a
//! failure and the clean-up).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;
use xtask::e2e_env::process::random_hex;
use xtask::e2e_env::{BinDir, CRI_SOCKET, ControlPlane, NODE_NAME, StartOptions};
use xtask::harness::agent::{self, Agent, AgentConfig, AgentDirs, CheckpointInfo, Inspect};
use xtask::harness::agent_binary;
use xtask::harness::cri::CriClient;
use xtask::harness::expect::Expect;
use xtask::harness::interrupt;
use xtask::harness::kubectl::{self, Kubectl};
use xtask::harness::objects::{
    AGENT_USER, CHECKPOINTER_SERVICE_ACCOUNT, Owner, PodBuilder, cluster_role, config_map, daemon_set,
    deployed_agent_rules, namespace, role_binding, rules_without, secret, service_account,
};
use xtask::harness::wait::{Probe, wait_for};

pub(crate) type ScenarioFn = fn(&mut Scenario<'_>) -> anyhow::Result<()>;

/// The deploy manifests' Role as a ClusterRole, bound per namespace by RoleBindings.
pub(crate) const AGENT_ROLE: &str = "pod-checkpointer";
/// The checkpointer's DaemonSet and the ServiceAccount its pods run as.
pub(crate) const CHECKPOINTER: &str = CHECKPOINTER_SERVICE_ACCOUNT;
/// The same without `secrets`, for the RBAC scenario.
pub(crate) const AGENT_ROLE_WITHOUT_SECRETS: &str = "pod-checkpointer-without-secrets";

/// Set to keep the logs of passing scenarios too (in `target/tmp/e2e-logs/`).
pub(crate) const KEEP_LOGS_ENV: &str = "E2E_KEEP_LOGS";

/// How long the hollow kubelet may take to (re)start a static pod after the API server was
/// hung: its own API calls block until they time out, which holds up its pod workers.
pub(crate) const KUBELET_AFTER_OUTAGE_TIMEOUT: Duration = Duration::from_secs(90);

pub(crate) struct Suite {
    pub(crate) plane: ControlPlane,
    pub(crate) kubectl: Kubectl,
    pub(crate) cri: CriClient,
    pub(crate) agent_bin: PathBuf,
    pub(crate) static_pods: PathBuf,
    kubelet_url: String,
    /// Where the logs of failed scenarios are copied (the work dir goes with the plane).
    failure_logs: PathBuf,
    apiserver_paused: bool,
}

impl Suite {
    /// Finds the binaries, starts the plane with its hollow node and creates the agent's
    /// ClusterRoles from the deploy manifests' Role.
    pub(crate) fn start() -> anyhow::Result<Suite> {
        let agent_bin = agent_binary()?;
        let bins = BinDir::cached()?;
        let port = |var: &str, default: u16| -> anyhow::Result<u16> {
            match std::env::var(var) {
                Ok(v) if !v.is_empty() => v.parse().with_context(|| format!("bad {var}={v}")),
                _ => Ok(default),
            }
        };
        let defaults = StartOptions::new(bins);
        let options = StartOptions {
            hollow_node: true,
            etcd_port: port("ETCD_PORT", defaults.etcd_port)?,
            apiserver_port: port("APISERVER_PORT", defaults.apiserver_port)?,
            ..defaults
        };
        let plane = ControlPlane::start(&options)?;
        let static_pods = plane.static_pod_dir().context("the plane has no hollow node")?;
        let kubelet_url = plane.kubelet_url().context("the plane has no hollow node")?;
        let kubectl = Kubectl::new(&plane.kubeconfig(), &plane.workdir().join("kubectl-cache"));
        let rules = deployed_agent_rules()?;
        kubectl.apply(&[
            cluster_role(AGENT_ROLE, &rules),
            cluster_role(AGENT_ROLE_WITHOUT_SECRETS, &rules_without(&rules, "secrets")),
        ])?;
        let failure_logs = Path::new(env!("CARGO_TARGET_TMPDIR")).join("e2e-logs");
        let _ = fs::remove_dir_all(&failure_logs);
        Ok(Suite {
            plane,
            kubectl,
            cri: CriClient::new(CRI_SOCKET),
            agent_bin,
            static_pods,
            kubelet_url,
            failure_logs,
            apiserver_paused: false,
        })
    }

    /// SIGSTOP: the API server hangs (accepts connections, answers nothing).
    pub(crate) fn pause_apiserver(&mut self) -> anyhow::Result<()> {
        self.plane.pause_apiserver()?;
        self.apiserver_paused = true;
        Ok(())
    }

    pub(crate) fn resume_apiserver(&mut self) -> anyhow::Result<()> {
        self.plane.resume_apiserver()?;
        self.apiserver_paused = false;
        Ok(())
    }

    /// SIGKILL: connections are refused.
    pub(crate) fn kill_apiserver(&mut self) -> anyhow::Result<()> {
        self.plane.kill_apiserver()
    }

    /// Starts it again on the same etcd, certs and port; returns once it is ready.
    pub(crate) fn restart_apiserver(&mut self) -> anyhow::Result<Duration> {
        self.apiserver_paused = false;
        self.plane.restart_apiserver()
    }

    /// After a scenario (a failed one may leave it paused or dead): makes sure the API server
    /// answers again.
    pub(crate) fn recover_apiserver(&mut self) -> anyhow::Result<()> {
        if self.apiserver_paused {
            self.resume_apiserver()?;
        }
        let answers = wait_for("the API server's /readyz", Duration::from_secs(10), || {
            Ok(match self.plane.api_get("/readyz") {
                Ok((200, _)) => Probe::Ready(()),
                Ok((code, _)) => Probe::Waiting(format!("HTTP {code}")),
                Err(e) => Probe::Waiting(format!("{e:#}")),
            })
        });
        if answers.is_err() {
            eprintln!("e2e: the API server does not answer after the scenario; restarting it");
            self.restart_apiserver()?;
        }
        Ok(())
    }
}

/// The checkpointer's own pod, created by hand as its DaemonSet would.
pub(crate) struct SelfPod {
    pub(crate) name: String,
    /// The name of its static copy: `<name>-node-1`.
    pub(crate) static_name: String,
    /// Its DaemonSet, to create a rolled pod of it.
    pub(crate) daemon_set: Owner,
}

/// A parent pod and how to create it again.
pub(crate) struct Parent {
    pub(crate) name: String,
    pub(crate) pod: PodBuilder,
    pub(crate) uid: String,
}

/// The Secret and ConfigMap a parent made by [`Scenario::create_parent_with_data`] mounts,
/// and their content.
pub(crate) const SECRET_DATA: &[(&str, &str)] = &[
    (
        "tls.crt",
        "-----BEGIN CERTIFICATE-----\ne2e\n-----END CERTIFICATE-----\n",
    ),
    ("tls.key", "e2e-private-key"),
];
pub(crate) const CONFIG_DATA: &[(&str, &str)] = &[("config.yaml", "apiVersion: v1\nkind: Config\n")];

pub(crate) struct Scenario<'s> {
    pub(crate) suite: &'s mut Suite,
    pub(crate) name: &'static str,
    pub(crate) ns: String,
    /// The scenario's own dir in the work dir (checkpoint dirs, locks, agent logs).
    pub(crate) dir: PathBuf,
    started: Instant,
    step: String,
    agent_logs: Vec<PathBuf>,
    dirs_used: Vec<AgentDirs>,
}

impl<'s> Scenario<'s> {
    /// Creates the scenario's dir and namespace, with the agent's role bound in it.
    pub(crate) fn new(suite: &'s mut Suite, name: &'static str, ns: &str) -> anyhow::Result<Scenario<'s>> {
        let dir = suite.plane.workdir().join("scenarios").join(name);
        fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        suite.kubectl.apply(&[
            namespace(ns),
            role_binding(ns, "pod-checkpointer", AGENT_ROLE, AGENT_USER),
        ])?;
        Ok(Scenario {
            suite,
            name,
            ns: ns.to_owned(),
            dir,
            started: Instant::now(),
            step: "set-up".into(),
            agent_logs: Vec::new(),
            dirs_used: Vec::new(),
        })
    }

    /// Announces the next step; a failure is reported as happening in the last one.
    pub(crate) fn step(&mut self, what: &str) {
        eprintln!("  [{:>5.1} s] {what}", self.started.elapsed().as_secs_f64());
        what.clone_into(&mut self.step);
    }

    /// Reports a failure (error, step, agent log tails; logs copied out of the work dir, as
    /// they are for every scenario with `E2E_KEEP_LOGS` set), then removes what the scenario
    /// left in the shared static-pod dir.
    pub(crate) fn finish(self, error: Option<&anyhow::Error>) -> anyhow::Result<()> {
        if let Some(error) = error.filter(|_| !interrupt::requested()) {
            eprintln!("--- {}: error in step \"{}\":\n{error:#}", self.name, self.step);
            for log in &self.agent_logs {
                let name = log.file_name().unwrap_or_default().to_string_lossy();
                eprintln!(
                    "--- last lines of {name} ---\n{}",
                    xtask::e2e_env::process::log_tail(log, 40)
                );
            }
            self.keep_logs();
        } else if std::env::var_os(KEEP_LOGS_ENV).is_some() {
            self.keep_logs();
        }
        self.clean_up()
    }

    fn keep_logs(&self) {
        let target = self.suite.failure_logs.join(self.name);
        if fs::create_dir_all(&target).is_err() {
            return;
        }
        let workdir = self.suite.plane.workdir();
        let plane_logs = ["apiserver.log", "hollow-node-1.log", "etcd.log"].map(|l| workdir.join(l));
        for log in self.agent_logs.iter().chain(&plane_logs) {
            if let Some(name) = log.file_name() {
                let _ = fs::copy(log, target.join(name));
            }
        }
        eprintln!("--- logs kept in {}", target.display());
    }

    /// Drains every checkpoint dir the scenario used (its agents are gone by now), then
    /// removes whatever is still in the static-pod dir for its namespace.
    fn clean_up(&self) -> anyhow::Result<()> {
        for dirs in &self.dirs_used {
            agent::drain(&self.suite.agent_bin, dirs)?;
        }
        let mut leftovers = Vec::new();
        for entry in fs::read_dir(&self.suite.static_pods)?.flatten() {
            let path = entry.path();
            let manifest: Option<Value> = fs::read(&path)
                .ok()
                .and_then(|bytes| serde_json::from_slice(&bytes).ok());
            if manifest.is_some_and(|m| m["metadata"]["namespace"] == self.ns.as_str()) {
                fs::remove_file(&path)?;
                leftovers.push(path.display().to_string());
            }
        }
        anyhow::ensure!(
            leftovers.is_empty(),
            "`pod-checkpointer drain` left static pods behind: {}",
            leftovers.join(", ")
        );
        Ok(())
    }

    /// `namespace/name` in this scenario's namespace.
    pub(crate) fn id(&self, name: &str) -> String {
        format!("{}/{name}", self.ns)
    }

    /// The dirs of one agent "node disk", kept for the clean-up.
    pub(crate) fn dirs(&mut self, name: &str) -> anyhow::Result<AgentDirs> {
        let dirs = AgentDirs::under(&self.dir.join(name), &self.suite.static_pods)?;
        self.dirs_used.push(dirs.clone());
        Ok(dirs)
    }

    /// `run`'s flags for node-1's checkpointer in this namespace, as the agent identity, with
    /// the hollow kubelet's API and CRI; GC strategy and grace period at their defaults.
    pub(crate) fn agent_config(&self, label: &str, pod_name: &str, dirs: &AgentDirs) -> AgentConfig {
        AgentConfig {
            label: label.to_owned(),
            node_name: NODE_NAME.to_owned(),
            pod_name: pod_name.to_owned(),
            pod_namespace: self.ns.clone(),
            kubeconfig: Some(self.suite.plane.agent_kubeconfig()),
            kubelet_url: self.suite.kubelet_url.clone(),
            runtime_endpoint: format!("unix://{CRI_SOCKET}"),
            dirs: dirs.clone(),
            namespaces: vec![self.ns.clone()],
            gc_strategy: None,
            grace_period: None,
        }
    }

    /// Starts an agent with its log in the scenario dir.
    pub(crate) fn start_agent(&mut self, config: &AgentConfig) -> anyhow::Result<Agent> {
        let agent = Agent::start(&self.suite.agent_bin, config, &self.dir)?;
        self.agent_logs.push(agent.log_path().to_owned());
        Ok(agent)
    }

    pub(crate) fn create(&self, object: &Value) -> anyhow::Result<Value> {
        self.suite.kubectl.create(object)
    }

    /// A DaemonSet `name` and one pod of it on node-1: created by hand, since no
    /// controller-manager runs.
    pub(crate) fn create_daemon_set_pod(
        &self,
        daemon_set_name: &str,
        checkpointed: bool,
    ) -> anyhow::Result<(Owner, Parent)> {
        let ds = self.create(&daemon_set(&self.ns, daemon_set_name))?;
        let owner = Owner::of(&ds)?;
        let parent = self.create_owned_pod(&owner, checkpointed)?;
        Ok((owner, parent))
    }

    /// Another pod of `owner` on node-1, named like a DaemonSet's (`<owner>-<random>`).
    pub(crate) fn create_owned_pod(&self, owner: &Owner, checkpointed: bool) -> anyhow::Result<Parent> {
        let name = format!("{}-{}", owner.name, random_hex(3)?);
        let mut pod = PodBuilder::new(&self.ns, &name, NODE_NAME)
            .owned_by(owner)
            .label("app", &owner.name);
        if owner.name == CHECKPOINTER {
            // Like the deployed DaemonSet's pods: the agent mints tokens of this account.
            pod = pod.service_account(CHECKPOINTER);
        }
        if checkpointed {
            pod = pod.checkpointed();
        }
        let created = self.create(&pod.build())?;
        Ok(Parent {
            name,
            pod,
            uid: kubectl::uid(&created)?,
        })
    }

    /// The checkpointer's own pod: a pod of DaemonSet `pod-checkpointer`, annotated so that it
    /// checkpoints itself.
    pub(crate) fn create_checkpointer_pod(&self) -> anyhow::Result<SelfPod> {
        self.create(&service_account(&self.ns, CHECKPOINTER))?;
        let (daemon_set, pod) = self.create_daemon_set_pod(CHECKPOINTER, true)?;
        Ok(SelfPod {
            static_name: format!("{}-{NODE_NAME}", pod.name),
            name: pod.name,
            daemon_set,
        })
    }

    /// An annotated parent `name` with `restartPolicy: Never`, mounting the Secret
    /// `<name>-certs` and the ConfigMap `<name>-config` (created here with [`SECRET_DATA`] and
    /// [`CONFIG_DATA`]).
    pub(crate) fn create_parent_with_data(&self, name: &str) -> anyhow::Result<Parent> {
        let secret_name = format!("{name}-certs");
        let config_name = format!("{name}-config");
        self.create(&secret(&self.ns, &secret_name, SECRET_DATA))?;
        self.create(&config_map(&self.ns, &config_name, CONFIG_DATA))?;
        let pod = PodBuilder::new(&self.ns, name, NODE_NAME)
            .checkpointed()
            .restart_never()
            .mount_secret(&secret_name)
            .mount_config_map(&config_name);
        self.create_parent(name, pod)
    }

    /// An annotated parent `name` without volumes.
    pub(crate) fn create_plain_parent(&self, name: &str) -> anyhow::Result<Parent> {
        let pod = PodBuilder::new(&self.ns, name, NODE_NAME).checkpointed();
        self.create_parent(name, pod)
    }

    fn create_parent(&self, name: &str, pod: PodBuilder) -> anyhow::Result<Parent> {
        let created = self.create(&pod.build())?;
        Ok(Parent {
            name: name.to_owned(),
            pod,
            uid: kubectl::uid(&created)?,
        })
    }

    /// Deletes the pod at once (as the kubelet confirms a deletion).
    pub(crate) fn delete_pod(&self, name: &str) -> anyhow::Result<()> {
        self.suite.kubectl.delete_now("pod", &self.ns, name)
    }

    /// Deletes and creates the parent again (same spec, new uid), as its controller would,
    /// and waits until the kubelet runs it; returns the new uid.
    pub(crate) fn recreate(&self, parent: &Parent) -> anyhow::Result<String> {
        self.delete_pod(&parent.name)?;
        self.expect_api_pod_gone(&parent.name)?;
        let created = self.create(&parent.pod.build())?;
        self.expect_api_pod_running(&parent.name)?;
        kubectl::uid(&created)
    }

    /// Stops the pod's containers and sandbox through the CRI, like a crash; with
    /// `restartPolicy: Never` the kubelet leaves it dead.
    pub(crate) fn crash(&self, name: &str) -> anyhow::Result<()> {
        self.suite.cri.stop_pod(&self.ns, name)?;
        self.expect_kubelet_stopped(name)
    }

    pub(crate) fn inspect(&self, dirs: &AgentDirs) -> anyhow::Result<Inspect> {
        agent::inspect(&self.suite.agent_bin, dirs)
    }

    pub(crate) fn expect(&self) -> Expect<'_> {
        Expect {
            kubectl: &self.suite.kubectl,
            cri: &self.suite.cri,
            agent_bin: &self.suite.agent_bin,
        }
    }

    /// Waits until `inspect` shows the checkpoint of `name` in `state` (`inactive`, `active`).
    pub(crate) fn expect_checkpoint(
        &self,
        dirs: &AgentDirs,
        name: &str,
        state: &str,
    ) -> anyhow::Result<CheckpointInfo> {
        self.expect_checkpoint_where(dirs, name, &format!("state {state}"), |c| c.state == state)
    }

    /// Waits until `inspect` shows a checkpoint of `name` for which `check` holds.
    pub(crate) fn expect_checkpoint_where(
        &self,
        dirs: &AgentDirs,
        name: &str,
        expected: &str,
        check: impl Fn(&CheckpointInfo) -> bool,
    ) -> anyhow::Result<CheckpointInfo> {
        self.expect()
            .checkpoint(dirs, &self.ns, name, expected, check)
            .map(|(checkpoint, _)| checkpoint)
    }

    /// Waits until `inspect` no longer shows a checkpoint of `name`.
    pub(crate) fn expect_no_checkpoint(&self, dirs: &AgentDirs, name: &str) -> anyhow::Result<()> {
        self.expect().no_checkpoint(dirs, &self.ns, name).map(drop)
    }

    /// Waits until the hollow kubelet's runtime has a ready sandbox for `name` in this
    /// namespace (for a static pod: `<manifest name>-node-1`).
    pub(crate) fn expect_kubelet_runs(&self, name: &str, timeout: Duration) -> anyhow::Result<()> {
        self.expect().kubelet_runs(&self.ns, name, timeout).map(drop)
    }

    /// Waits until the runtime has no ready sandbox for `name` any more.
    pub(crate) fn expect_kubelet_stopped(&self, name: &str) -> anyhow::Result<()> {
        self.expect().kubelet_stopped(&self.ns, name).map(drop)
    }

    /// Waits until the API has pod `name` and `check` holds for it.
    pub(crate) fn expect_api_pod(
        &self,
        name: &str,
        expected: &str,
        timeout: Duration,
        check: impl Fn(&Value) -> bool,
    ) -> anyhow::Result<Value> {
        self.expect()
            .api_pod(&self.ns, name, expected, timeout, check)
            .map(|(pod, _)| pod)
    }

    pub(crate) fn expect_api_pod_running(&self, name: &str) -> anyhow::Result<()> {
        self.expect().api_pod_running(&self.ns, name).map(drop)
    }

    pub(crate) fn expect_api_pod_gone(&self, name: &str) -> anyhow::Result<()> {
        self.expect().api_pod_gone(&self.ns, name).map(drop)
    }
}
