//! [`Testbed`]: the control plane with its hollow node and what drives the agent against it
//! (kubectl as admin, the node's CRI, the agent binary), as the end-to-end suite, the bench
//! and the demo all use it: namespaces where the agent's user has its deployed rights, the
//! checkpointer's own pod and its parents, agents configured for node-1, the API server taken
//! away and brought back.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde_json::Value;

use super::agent::{self, AgentConfig, AgentDirs, Inspect};
use super::expect::Expect;
use super::kubectl::{self, Kubectl};
use super::objects::{
    AGENT_USER, CHECKPOINTER_SERVICE_ACCOUNT, Owner, PodBuilder, STATIC_SERVICE_ACCOUNT, cluster_role,
    cluster_role_binding, config_map, daemon_set, deployed_agent_cluster_rules, deployed_agent_rules,
    namespace, role_binding, rules_without, secret, service_account, token_role_binding, token_rules,
};
use crate::e2e_env::cri::CriClient;
use crate::e2e_env::{CRI_SOCKET, ControlPlane, NODE_NAME};
use crate::process::random_hex;
use crate::progress::Progress;
use crate::wait::{Probe, wait_for};

/// The ClusterRole with the rules of the deploy manifests' Role, which
/// [`Testbed::create_namespace`] binds to the agent's user and both of its ServiceAccounts
/// (without minting tokens: that is [`AGENT_TOKEN_ROLE`]).
pub const AGENT_ROLE: &str = "pod-checkpointer";
/// The ClusterRole that lets the agent mint tokens for the static copy's ServiceAccount
/// only, bound in each namespace to the agent's user and its DaemonSet's ServiceAccount,
/// never to the static copy's.
pub const AGENT_TOKEN_ROLE: &str = "pod-checkpointer-token";
/// The ClusterRole with the rules of the deploy manifests' ClusterRole, bound to the
/// agent's user cluster-wide.
pub const AGENT_CLUSTER_ROLE: &str = "pod-checkpointer-cluster";

/// The content of the Secret a parent made by [`Testbed::create_parent_data`] mounts.
const SECRET_DATA: &[(&str, &str)] = &[
    (
        "tls.crt",
        "-----BEGIN CERTIFICATE-----\ne2e\n-----END CERTIFICATE-----\n",
    ),
    ("tls.key", "e2e-private-key"),
];
/// The content of its ConfigMap.
const CONFIG_DATA: &[(&str, &str)] = &[("config.yaml", "apiVersion: v1\nkind: Config\n")];

/// The checkpointer's own pod, created by hand as its DaemonSet would.
pub struct SelfPod {
    pub name: String,
    /// The name of its static copy: `<name>-node-1`.
    pub static_name: String,
    /// Its DaemonSet, to create a rolled pod of it.
    pub daemon_set: Owner,
}

/// A parent pod and how to create it again.
pub struct Parent {
    pub name: String,
    pub pod: PodBuilder,
    pub uid: String,
}

/// A control plane started with its hollow node (`node-1`), and the clients that drive it.
pub struct Testbed {
    pub plane: ControlPlane,
    /// kubectl as admin.
    pub kubectl: Kubectl,
    /// The hollow kubelet's fake runtime.
    pub cri: CriClient,
    pub agent_bin: PathBuf,
    /// The hollow kubelet's static pod dir, shared by every agent.
    pub static_pods: PathBuf,
    kubelet_url: String,
    apiserver_paused: bool,
}

impl Testbed {
    /// Takes over `plane` (started with its hollow node) and creates the ClusterRole
    /// [`AGENT_ROLE`] from the deploy manifests' Role.
    pub fn new(plane: ControlPlane, agent_bin: PathBuf) -> anyhow::Result<Testbed> {
        let static_pods = plane
            .static_pod_dir()
            .context("the control plane has no hollow node: start it with --hollow-node")?;
        let kubelet_url = plane
            .kubelet_url()
            .context("the control plane has no hollow node")?;
        let kubectl = Kubectl::new(&plane.kubeconfig(), &plane.workdir().join("kubectl-cache"));
        let mut objects = agent_cluster_roles()?;
        // What the deployed ClusterRole grants (its own node), bound to the agent's user.
        objects.push(cluster_role_binding(
            AGENT_CLUSTER_ROLE,
            AGENT_CLUSTER_ROLE,
            AGENT_USER,
        ));
        kubectl.apply(&objects)?;
        Ok(Testbed {
            plane,
            kubectl,
            cri: CriClient::new(CRI_SOCKET),
            agent_bin,
            static_pods,
            kubelet_url,
            apiserver_paused: false,
        })
    }

    /// The hollow kubelet's API, plain HTTP.
    pub fn kubelet_url(&self) -> &str {
        &self.kubelet_url
    }

    /// Expectations on the API, the runtime and the agent's disk.
    pub fn expect(&self) -> Expect<'_> {
        Expect {
            kubectl: &self.kubectl,
            cri: &self.cri,
            agent_bin: &self.agent_bin,
        }
    }

    /// Namespace `ns`, where the agent's user (and the checkpointer's ServiceAccounts) has
    /// `cluster_role`, and the agent's user (and its DaemonSet's ServiceAccount) may mint
    /// tokens for the static copy's ServiceAccount.
    pub fn create_namespace(&self, ns: &str, cluster_role: &str) -> anyhow::Result<()> {
        self.kubectl.apply(&[
            namespace(ns),
            role_binding(ns, "pod-checkpointer", cluster_role, AGENT_USER),
            token_role_binding(ns, AGENT_TOKEN_ROLE, AGENT_USER),
        ])
    }

    /// The dirs of one agent's "node disk" under `root`, with active checkpoints in the
    /// kubelet's static pod dir.
    pub fn agent_dirs(&self, root: &Path) -> anyhow::Result<AgentDirs> {
        AgentDirs::under(root, &self.static_pods)
    }

    /// `run`'s flags for node-1's checkpointer as the agent's user, looking after `ns`, with
    /// the hollow kubelet's API and CRI; GC strategy and grace period at their defaults.
    pub fn agent_config(&self, label: &str, ns: &str, pod_name: &str, dirs: &AgentDirs) -> AgentConfig {
        AgentConfig {
            label: label.to_owned(),
            node_name: NODE_NAME.to_owned(),
            pod_name: pod_name.to_owned(),
            pod_namespace: ns.to_owned(),
            kubeconfig: Some(self.plane.agent_kubeconfig()),
            kubelet_url: self.kubelet_url.clone(),
            runtime_endpoint: format!("unix://{CRI_SOCKET}"),
            dirs: dirs.clone(),
            namespaces: vec![ns.to_owned()],
            gc_strategy: None,
            grace_period: None,
            extra_args: Vec::new(),
        }
    }

    /// `pod-checkpointer inspect -o json` on `dirs`.
    pub fn inspect(&self, dirs: &AgentDirs) -> anyhow::Result<Inspect> {
        agent::inspect(&self.agent_bin, dirs)
    }

    /// `pod-checkpointer drain --force` on `dirs` (its agent is gone): removes its checkpoints,
    /// static pods included.
    pub fn drain(&self, dirs: &AgentDirs) -> anyhow::Result<()> {
        agent::drain(&self.agent_bin, dirs).map(drop)
    }

    /// A DaemonSet `name` in `ns` and one pod of it on node-1: created by hand, since no
    /// controller-manager runs.
    pub fn create_daemon_set_pod(
        &self,
        ns: &str,
        name: &str,
        checkpointed: bool,
    ) -> anyhow::Result<(Owner, Parent)> {
        let ds = self.kubectl.create(&daemon_set(ns, name))?;
        let owner = Owner::of(&ds)?;
        let parent = self.create_owned_pod(ns, &owner, checkpointed)?;
        Ok((owner, parent))
    }

    /// Another pod of `owner` on node-1, named like a DaemonSet's (`<owner>-<random>`).
    pub fn create_owned_pod(&self, ns: &str, owner: &Owner, checkpointed: bool) -> anyhow::Result<Parent> {
        let name = format!("{}-{}", owner.name, random_hex(3)?);
        let mut pod = PodBuilder::new(ns, &name, NODE_NAME)
            .owned_by(owner)
            .label("app", &owner.name);
        if owner.name == CHECKPOINTER_SERVICE_ACCOUNT {
            // Like the deployed DaemonSet's pods: the agent mints tokens of this account.
            pod = pod.service_account(CHECKPOINTER_SERVICE_ACCOUNT);
        }
        if checkpointed {
            pod = pod.checkpointed();
        }
        self.create_parent(pod)
    }

    /// The checkpointer's own pod in `ns`: a pod of DaemonSet `pod-checkpointer` running as
    /// its ServiceAccount, annotated so that it checkpoints itself; and the static copy's
    /// ServiceAccount.
    pub fn create_checkpointer_pod(&self, ns: &str) -> anyhow::Result<SelfPod> {
        self.kubectl
            .create(&service_account(ns, CHECKPOINTER_SERVICE_ACCOUNT))?;
        self.kubectl
            .create(&service_account(ns, STATIC_SERVICE_ACCOUNT))?;
        let (daemon_set, pod) = self.create_daemon_set_pod(ns, CHECKPOINTER_SERVICE_ACCOUNT, true)?;
        Ok(SelfPod {
            static_name: format!("{}-{NODE_NAME}", pod.name),
            name: pod.name,
            daemon_set,
        })
    }

    /// The Secret `<name>-certs` ([`SECRET_DATA`]) and the ConfigMap `<name>-config`
    /// ([`CONFIG_DATA`]) that [`parent_with_data`] mounts.
    pub fn create_parent_data(&self, ns: &str, name: &str) -> anyhow::Result<()> {
        self.kubectl
            .create(&secret(ns, &format!("{name}-certs"), SECRET_DATA))?;
        self.kubectl
            .create(&config_map(ns, &format!("{name}-config"), CONFIG_DATA))?;
        Ok(())
    }

    /// Creates `pod`.
    pub fn create_parent(&self, pod: PodBuilder) -> anyhow::Result<Parent> {
        let created = self.kubectl.create(&pod.build())?;
        Ok(Parent {
            name: created["metadata"]["name"]
                .as_str()
                .context("the created pod has no name")?
                .to_owned(),
            uid: kubectl::uid(&created)?,
            pod,
        })
    }

    /// Removes the static pods of namespace `ns` that are still in the kubelet's dir (what a
    /// drain should have removed); returns their paths.
    pub fn remove_static_pods_of(&self, ns: &str) -> anyhow::Result<Vec<String>> {
        let mut removed = Vec::new();
        for entry in fs::read_dir(&self.static_pods)?.flatten() {
            let path = entry.path();
            let manifest: Option<Value> = fs::read(&path)
                .ok()
                .and_then(|bytes| serde_json::from_slice(&bytes).ok());
            if manifest.is_some_and(|m| m["metadata"]["namespace"] == ns) {
                fs::remove_file(&path)?;
                removed.push(path.display().to_string());
            }
        }
        Ok(removed)
    }

    /// SIGSTOP: the API server hangs (accepts connections, answers nothing).
    pub fn pause_apiserver(&mut self) -> anyhow::Result<()> {
        self.plane.pause_apiserver()?;
        self.apiserver_paused = true;
        Ok(())
    }

    pub fn resume_apiserver(&mut self) -> anyhow::Result<()> {
        self.plane.resume_apiserver()?;
        self.apiserver_paused = false;
        Ok(())
    }

    /// SIGKILL: connections are refused.
    pub fn kill_apiserver(&mut self) -> anyhow::Result<()> {
        self.plane.kill_apiserver()
    }

    /// Starts it again on the same etcd, certs and port; returns once it is ready, with the
    /// time that took.
    pub fn restart_apiserver(&mut self) -> anyhow::Result<Duration> {
        self.apiserver_paused = false;
        self.plane.restart_apiserver()
    }

    /// After something that may have left it paused or dead (a failed scenario or part):
    /// makes sure the API server answers again.
    /// Starts the hollow node again if it died (its crash would fail every later scenario
    /// with pods that never run), saying why from the end of its log.
    pub fn recover_hollow_node(&mut self) -> anyhow::Result<()> {
        if self.plane.hollow_node_running() {
            return Ok(());
        }
        let log = self.plane.workdir().join(format!("hollow-{NODE_NAME}.log"));
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let why = (text.lines())
            .find(|l| l.starts_with("fatal error:") || l.starts_with("panic:"))
            .unwrap_or("no fatal error in its log");
        Progress::new("testbed").say(&format!("the hollow node died ({why}); starting it again"));
        self.plane.restart_hollow_node()
    }

    pub fn recover_apiserver(&mut self) -> anyhow::Result<()> {
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
            Progress::new("testbed").say("the API server does not answer; restarting it");
            self.restart_apiserver()?;
        }
        Ok(())
    }
}

/// The ClusterRoles [`AGENT_ROLE`], [`AGENT_TOKEN_ROLE`] and [`AGENT_CLUSTER_ROLE`] with the
/// deploy manifests' rules, for the caller to bind.
pub fn agent_cluster_roles() -> anyhow::Result<Vec<Value>> {
    Ok(vec![
        cluster_role(
            AGENT_ROLE,
            &rules_without(&deployed_agent_rules()?, "serviceaccounts/token"),
        ),
        cluster_role(AGENT_TOKEN_ROLE, &token_rules()),
        cluster_role(AGENT_CLUSTER_ROLE, &deployed_agent_cluster_rules()?),
    ])
}

/// An annotated parent `ns/name` on node-1 mounting the Secret and ConfigMap that
/// [`Testbed::create_parent_data`] made for `data`.
pub fn parent_with_data(ns: &str, name: &str, data: &str) -> PodBuilder {
    PodBuilder::new(ns, name, NODE_NAME)
        .checkpointed()
        .mount_secret(&format!("{data}-certs"))
        .mount_config_map(&format!("{data}-config"))
}
