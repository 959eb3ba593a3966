//! `cargo xtask demo`: the README's "run it" command. Starts a local control plane (etcd,
//! kube-apiserver v1.20.2, a hollow kubelet as node-1), runs `pod-checkpointer run` as
//! node-1's checkpointer and walks one annotated "kube-apiserver" pod through the agent's
//! life cycle, narrating each step with its timing on stderr:
//!
//! checkpoint written → API server and parent gone → checkpoint activated and run by the
//! kubelet → API server back → parent re-created → checkpoint deactivated → parent deleted →
//! checkpoint garbage-collected.
//!
//! Everything runs in a temporary work dir that is removed at the end. Ctrl-C stops the
//! demo where it is and cleans up the same way (see `interrupt`).

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::e2e_env::{self, ControlPlane, NODE_NAME, StartOptions};
use crate::harness::agent::{Agent, AgentConfig};
use crate::harness::kubectl;
use crate::harness::objects::{AGENT_USER, CHECKPOINT_ANNOTATION, CHECKPOINTER_SERVICE_ACCOUNT};
use crate::harness::testbed::{AGENT_ROLE, Testbed, parent_with_data};
use crate::harness::{agent_binary, files_under};
use crate::interrupt;
use crate::progress::Progress;
use crate::progress::human_duration;
use crate::wait::{DEFAULT_TIMEOUT, Probe, wait_for};

/// A narrated run of pod-checkpointer against a local control plane.
#[derive(clap::Args)]
pub struct Demo {
    /// How long a deleted parent's checkpoint is kept (the agent's --checkpoint-grace-period).
    #[arg(long, default_value = "2s")]
    grace_period: String,
    /// The Kubernetes release to run on (`1.20`: Debian's source build).
    #[arg(long, value_enum, default_value = "1.37")]
    kubernetes: e2e_env::Release,
}

/// Where the demo's pods live: where a self-hosted control plane's pods live.
const NAMESPACE: &str = "kube-system";
/// The demo's parent: a stand-in for a self-hosted API server (the kubelet is hollow, so no
/// process really runs).
const PARENT: &str = "kube-apiserver";

impl Demo {
    /// The release it runs on (`--kubernetes`).
    pub fn kubernetes(&self) -> e2e_env::Release {
        self.kubernetes
    }

    pub fn run(&self) -> anyhow::Result<()> {
        // The agent and the control plane live inside `demo` and are stopped when it returns,
        // on success, on failure and on Ctrl-C alike.
        interrupt::run(
            Progress::new("demo"),
            "everything the demo started is stopped and its work dir removed",
            || self.demo(),
        )
    }

    fn demo(&self) -> anyhow::Result<()> {
        let say = Narrator::new();
        say.line("building what the demo runs: the control plane's binaries (cached after the first run, ~8.5 min cold for 1.37) and the agent");
        let bins = e2e_env::ensure_built_release(self.kubernetes)?;
        crate::run("cargo", &["build", "-p", "ckpt-bin"])?;
        let agent_bin = agent_binary()?;

        say.line(&format!(
            "starting etcd, kube-apiserver {} and a hollow kubelet registered as node-1",
            self.kubernetes
        ));
        let plane = ControlPlane::start(&StartOptions {
            hollow_node: true,
            ..StartOptions::new(bins)
        })?;
        let mut testbed = Testbed::new(plane, agent_bin)?;
        let workdir = testbed.plane.workdir().to_owned();

        say.line(&format!(
            "granting the agent's identity (user `{AGENT_USER}`) in {NAMESPACE} the rules of the deploy manifests' Role (deploy/pod-checkpointer.yaml)"
        ));
        testbed.create_namespace(NAMESPACE, AGENT_ROLE)?;

        say.line(&format!(
            "creating the checkpointer's own DaemonSet pod, and {NAMESPACE}/{PARENT} (annotation {CHECKPOINT_ANNOTATION}=true, restartPolicy Never) mounting Secret {PARENT}-certs and ConfigMap {PARENT}-config"
        ));
        let me = testbed.create_checkpointer_pod(NAMESPACE)?;
        testbed.create_parent_data(NAMESPACE, PARENT)?;
        let parent = testbed.create_parent(parent_with_data(NAMESPACE, PARENT, PARENT).restart_never())?;
        let took = testbed.expect().api_pod_running(NAMESPACE, PARENT)?;
        say.line(&format!(
            "the kubelet runs {NAMESPACE}/{PARENT} ({} after it was created)",
            human_duration(took)
        ));

        let dirs = testbed.agent_dirs(&workdir.join("node-1"))?;
        let config = AgentConfig {
            gc_strategy: Some("grace-period".into()),
            grace_period: Some(self.grace_period.clone()),
            ..testbed.agent_config("node-1", NAMESPACE, &me.name, &dirs)
        };
        let started = Instant::now();
        let mut agent = Agent::start(&testbed.agent_bin, &config, &workdir)?;
        say.line(&format!(
            "started `pod-checkpointer run` as node-1's checkpointer (pid {}, --gc-strategy grace-period --checkpoint-grace-period {}); its log: {}",
            agent.pid(),
            self.grace_period,
            agent.log_path().display()
        ));
        agent.wait_ready()?;

        // 1. Checkpoint written.
        testbed
            .expect()
            .checkpoint(&dirs, NAMESPACE, PARENT, "state inactive and 3 data files", |c| {
                c.state == "inactive" && c.data_files == 3
            })?;
        say.step(
            "checkpoint written",
            started.elapsed(),
            "after the agent started; on node-1's disk:",
        );
        say.files(&dirs.checkpoint_dir);
        testbed
            .expect()
            .checkpoint(&dirs, NAMESPACE, &me.name, "state active", |c| {
                c.state == "active"
            })?;
        let me_static = &me.static_name;
        testbed
            .expect()
            .kubelet_runs(NAMESPACE, me_static, DEFAULT_TIMEOUT)?;
        say.line(&format!(
            "the checkpointer checkpointed itself too: its static copy is always active in {} and the kubelet runs it as {NAMESPACE}/{me_static}",
            testbed.static_pods.display()
        ));
        let kept = dirs.checkpoint_dir.join("pod-checkpointer/kubeconfig");
        wait_for("the static copy's kubeconfig", DEFAULT_TIMEOUT, || {
            Ok(if kept.is_file() {
                Probe::Ready(())
            } else {
                Probe::Waiting(format!("no {}", kept.display()))
            })
        })?;
        say.line(&format!(
            "and it keeps API credentials for that static copy, which has no service-account token: {} (0600; a token of ServiceAccount {NAMESPACE}/{CHECKPOINTER_SERVICE_ACCOUNT}, refreshed hourly)",
            kept.display()
        ));

        // 2. API server and parent gone.
        say.line(&format!(
            "stopping the API server (SIGKILL) and {PARENT}'s container (StopContainer + StopPodSandbox on the kubelet's CRI socket, like a crash)"
        ));
        let outage = Instant::now();
        testbed.kill_apiserver()?;
        testbed.cri.stop_pod(NAMESPACE, PARENT)?;
        testbed.expect().kubelet_stopped(NAMESPACE, PARENT)?;

        // 3. Activated, and run by the kubelet.
        let (active, _) = testbed
            .expect()
            .checkpoint(&dirs, NAMESPACE, PARENT, "state active", |c| c.state == "active")?;
        say.step(
            "checkpoint activated",
            outage.elapsed(),
            &format!(
                "after the outage: static pod file {}",
                active
                    .active_manifest
                    .as_deref()
                    .map(Path::display)
                    .map(|p| p.to_string())
                    .unwrap_or_default()
            ),
        );
        let static_parent = format!("{PARENT}-{NODE_NAME}");
        testbed
            .expect()
            .kubelet_runs(NAMESPACE, &static_parent, DEFAULT_TIMEOUT)?;
        say.step(
            "the kubelet runs the checkpoint",
            outage.elapsed(),
            &format!("after the outage, as static pod {NAMESPACE}/{static_parent}, without any API server"),
        );

        // 4. API server back.
        say.line("starting the API server again");
        let took = testbed.restart_apiserver()?;
        say.step("API server back", took, "to /readyz 200");
        testbed.expect().api_pod(
            NAMESPACE,
            &static_parent,
            "present (mirror pod)",
            Duration::from_secs(90),
            |_| true,
        )?;
        let (old, _) = testbed
            .expect()
            .api_pod(NAMESPACE, PARENT, "present", DEFAULT_TIMEOUT, |_| true)?;
        let state = testbed
            .inspect(&dirs)?
            .get(&format!("{NAMESPACE}/{PARENT}"))
            .map(|c| c.state.clone())
            .unwrap_or_else(|| "missing".into());
        say.line(&format!(
            "the kubelet registered the static copy as mirror pod {NAMESPACE}/{static_parent}; the parent is {} (its container exited) and does not run, so its checkpoint stays {state}: after a reboot this static copy may be the only API server",
            kubectl::pod_phase(&old)
        ));

        // 5. Parent re-created, checkpoint deactivated.
        say.line(&format!(
            "re-creating {NAMESPACE}/{PARENT}, as its controller would"
        ));
        let recreated = Instant::now();
        testbed.kubectl.delete_now("pod", NAMESPACE, PARENT)?;
        testbed.expect().api_pod_gone(NAMESPACE, PARENT)?;
        let new_uid = kubectl::uid(&testbed.kubectl.create(&parent.pod.build())?)?;
        testbed.expect().api_pod_running(NAMESPACE, PARENT)?;
        say.step(
            "the parent runs again",
            recreated.elapsed(),
            "after it was re-created",
        );
        testbed
            .expect()
            .checkpoint(&dirs, NAMESPACE, PARENT, "state inactive and the new uid", |c| {
                c.state == "inactive" && c.parent_uid.as_deref() == Some(new_uid.as_str())
            })?;
        say.step(
            "checkpoint deactivated",
            recreated.elapsed(),
            "after the re-creation: the static pod file is gone, the inactive copy follows the new pod",
        );
        testbed.expect().kubelet_stopped(NAMESPACE, &static_parent)?;
        say.step(
            "the kubelet stopped the static copy",
            recreated.elapsed(),
            "after the re-creation",
        );

        // 6. Parent deleted, checkpoint garbage-collected.
        let before: BTreeSet<String> = files_under(&dirs.checkpoint_dir).into_iter().collect();
        say.line(&format!(
            "deleting {NAMESPACE}/{PARENT} for good (grace period {})",
            self.grace_period
        ));
        let deleted = Instant::now();
        testbed.kubectl.delete_now("pod", NAMESPACE, PARENT)?;
        testbed.expect().no_checkpoint(&dirs, NAMESPACE, PARENT)?;
        say.step(
            "garbage-collected",
            deleted.elapsed(),
            "after the deletion; removed:",
        );
        let after: BTreeSet<String> = files_under(&dirs.checkpoint_dir).into_iter().collect();
        for file in before.difference(&after) {
            eprintln!("      {file}");
        }

        say.line("stopping the agent (SIGTERM) and the control plane");
        let status = agent.stop()?;
        anyhow::ensure!(status.success(), "the agent exited with {status}");
        drop(agent);
        testbed.plane.stop()?;
        say.line(&format!(
            "demo complete; the work dir {} is removed",
            workdir.display()
        ));
        Ok(())
    }
}

/// Narration on stderr, stamped with the time since the demo started.
struct Narrator {
    progress: Progress,
}

impl Narrator {
    fn new() -> Narrator {
        Narrator {
            progress: Progress::timed("demo"),
        }
    }

    fn line(&self, message: &str) {
        self.progress.say(message);
    }

    /// `==> what: 0.4 s detail`, for the milestones.
    fn step(&self, what: &str, took: Duration, detail: &str) {
        self.line(&format!("==> {what}: {} {detail}", human_duration(took)));
    }

    /// The files under `dir`, indented.
    fn files(&self, dir: &Path) {
        for file in files_under(dir) {
            eprintln!("      {}", dir.join(file).display());
        }
    }
}
