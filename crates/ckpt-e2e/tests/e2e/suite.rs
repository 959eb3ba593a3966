//! The suite's shared state (a [`Testbed`] with the suite's ClusterRoles, started by
//! [`start`]) and each scenario's context ([`Scenario`]: its namespace and dirs, step
//! narration, the objects and expectations scenarios share, the report of a failure and the
//! clean-up).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use ckpt_e2e::e2e_env::{self, ControlPlane, NODE_NAME, Release, StartOptions};
use ckpt_e2e::harness::agent::{Agent, AgentConfig, AgentDirs, CheckpointInfo, Inspect};
use ckpt_e2e::harness::agent_binary;
use ckpt_e2e::harness::expect::Expect;
use ckpt_e2e::harness::objects::{Owner, PodBuilder, cluster_role, deployed_agent_rules, rules_without};
pub(crate) use ckpt_e2e::harness::testbed::{AGENT_ROLE, Parent};
use ckpt_e2e::harness::testbed::{SelfPod, Testbed, parent_with_data};
use ckpt_e2e::interrupt;
use ckpt_e2e::progress::Progress;
use serde_json::Value;

pub(crate) type ScenarioFn = fn(&mut Scenario<'_>) -> anyhow::Result<()>;

/// The same as [`AGENT_ROLE`] without `secrets`, for the RBAC scenario.
pub(crate) const AGENT_ROLE_WITHOUT_SECRETS: &str = "pod-checkpointer-without-secrets";

/// Set to keep the logs of passing scenarios too (in `target/tmp/e2e-logs/`).
pub(crate) const KEEP_LOGS_ENV: &str = "E2E_KEEP_LOGS";

/// How long the hollow kubelet may take to (re)start a static pod after the API server was
/// hung: its own API calls block until they time out, which holds up its pod workers.
pub(crate) const KUBELET_AFTER_OUTAGE_TIMEOUT: Duration = Duration::from_secs(90);

/// Where the logs of failed scenarios are copied (the work dir goes with the plane).
pub(crate) fn failure_logs() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("e2e-logs")
}

/// Finds the binaries, starts the plane with its hollow node (on `ETCD_PORT` and
/// `APISERVER_PORT` when set) and creates the suite's ClusterRole without `secrets`.
pub(crate) fn start() -> anyhow::Result<Testbed> {
    let agent_bin = agent_binary()?;
    let bins = e2e_env::cached_bins(Release::from_env()?)?;
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
    let testbed = Testbed::new(ControlPlane::start(&options)?, agent_bin)?;
    let rules = deployed_agent_rules()?;
    testbed.kubectl.apply(&[cluster_role(
        AGENT_ROLE_WITHOUT_SECRETS,
        &rules_without(&rules, "secrets"),
    )])?;
    let _ = fs::remove_dir_all(failure_logs());
    Ok(testbed)
}

pub(crate) struct Scenario<'s> {
    /// The testbed every scenario of the run shares.
    pub(crate) suite: &'s mut Testbed,
    pub(crate) name: &'static str,
    pub(crate) ns: String,
    /// The scenario's own dir in the work dir (checkpoint dirs, locks, agent logs).
    pub(crate) dir: PathBuf,
    progress: Progress,
    step: String,
    agent_logs: Vec<PathBuf>,
    dirs_used: Vec<AgentDirs>,
}

impl<'s> Scenario<'s> {
    /// Creates the scenario's dir and namespace, with the agent's role bound in it.
    pub(crate) fn new(suite: &'s mut Testbed, name: &'static str, ns: &str) -> anyhow::Result<Scenario<'s>> {
        let dir = suite.plane.workdir().join("scenarios").join(name);
        fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        suite.create_namespace(ns, AGENT_ROLE)?;
        Ok(Scenario {
            suite,
            name,
            ns: ns.to_owned(),
            dir,
            progress: Progress::timed("e2e"),
            step: "set-up".into(),
            agent_logs: Vec::new(),
            dirs_used: Vec::new(),
        })
    }

    /// Announces the next step; a failure is reported as happening in the last one.
    pub(crate) fn step(&mut self, what: &str) {
        self.progress.say(what);
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
                    ckpt_e2e::process::log_tail(log, 40)
                );
            }
            self.keep_logs();
        } else if std::env::var_os(KEEP_LOGS_ENV).is_some() {
            self.keep_logs();
        }
        self.clean_up()
    }

    fn keep_logs(&self) {
        let target = failure_logs().join(self.name);
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
            self.suite.drain(dirs)?;
        }
        let leftovers = self.suite.remove_static_pods_of(&self.ns)?;
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
        let dirs = self.suite.agent_dirs(&self.dir.join(name))?;
        self.dirs_used.push(dirs.clone());
        Ok(dirs)
    }

    /// `run`'s flags for node-1's checkpointer in this namespace, as the agent identity, with
    /// the hollow kubelet's API and CRI; GC strategy and grace period at their defaults.
    pub(crate) fn agent_config(&self, label: &str, pod_name: &str, dirs: &AgentDirs) -> AgentConfig {
        self.suite.agent_config(label, &self.ns, pod_name, dirs)
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
        self.suite
            .create_daemon_set_pod(&self.ns, daemon_set_name, checkpointed)
    }

    /// Another pod of `owner` on node-1, named like a DaemonSet's (`<owner>-<random>`).
    pub(crate) fn create_owned_pod(&self, owner: &Owner, checkpointed: bool) -> anyhow::Result<Parent> {
        self.suite.create_owned_pod(&self.ns, owner, checkpointed)
    }

    /// The checkpointer's own pod: a pod of DaemonSet `pod-checkpointer`, annotated so that it
    /// checkpoints itself.
    pub(crate) fn create_checkpointer_pod(&self) -> anyhow::Result<SelfPod> {
        self.suite.create_checkpointer_pod(&self.ns)
    }

    /// An annotated parent `name` with `restartPolicy: Never`, mounting the Secret
    /// `<name>-certs` and the ConfigMap `<name>-config` (created here with [`SECRET_DATA`] and
    /// [`CONFIG_DATA`]).
    pub(crate) fn create_parent_with_data(&self, name: &str) -> anyhow::Result<Parent> {
        self.suite.create_parent_data(&self.ns, name)?;
        self.suite
            .create_parent(parent_with_data(&self.ns, name, name).restart_never())
    }

    /// An annotated parent `name` without volumes.
    pub(crate) fn create_plain_parent(&self, name: &str) -> anyhow::Result<Parent> {
        self.suite
            .create_parent(PodBuilder::new(&self.ns, name, NODE_NAME).checkpointed())
    }

    /// Deletes a DaemonSet (nothing turns it into pods here; its pods stay until deleted).
    pub(crate) fn delete_daemon_set(&self, name: &str) -> anyhow::Result<()> {
        self.suite.kubectl.delete_now("daemonset", &self.ns, name)
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
        ckpt_e2e::harness::kubectl::uid(&created)
    }

    /// Stops the pod's containers and sandbox through the CRI, like a crash; with
    /// `restartPolicy: Never` the kubelet leaves it dead.
    pub(crate) fn crash(&self, name: &str) -> anyhow::Result<()> {
        self.suite.cri.stop_pod(&self.ns, name)?;
        self.expect_kubelet_stopped(name)
    }

    pub(crate) fn inspect(&self, dirs: &AgentDirs) -> anyhow::Result<Inspect> {
        self.suite.inspect(dirs)
    }

    pub(crate) fn expect(&self) -> Expect<'_> {
        self.suite.expect()
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

    /// Re-creates `parent` (as its controller would) and waits until its checkpoint is
    /// inactive again with the new pod's uid; returns the checkpoint.
    pub(crate) fn recreate_and_expect_inactive(
        &self,
        dirs: &AgentDirs,
        parent: &Parent,
    ) -> anyhow::Result<CheckpointInfo> {
        let new_uid = self.recreate(parent)?;
        self.expect_checkpoint_where(
            dirs,
            &parent.name,
            "state inactive and the new parent's uid",
            |c| c.state == "inactive" && c.parent_uid.as_deref() == Some(new_uid.as_str()),
        )
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
