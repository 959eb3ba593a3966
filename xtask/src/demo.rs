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
//! demo where it is and cleans up the same way (see `harness::interrupt`).

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use xtask::e2e_env::process::random_hex;
use xtask::e2e_env::{self, CRI_SOCKET, ControlPlane, NODE_NAME, StartOptions, human_duration};
use xtask::harness::agent::{self, Agent, AgentConfig, AgentDirs};
use xtask::harness::cri::CriClient;
use xtask::harness::expect::Expect;
use xtask::harness::kubectl::{self, Kubectl};
use xtask::harness::objects::{
    AGENT_USER, CHECKPOINT_ANNOTATION, CHECKPOINTER_SERVICE_ACCOUNT, Owner, PodBuilder, cluster_role,
    config_map, daemon_set, deployed_agent_rules, role_binding, secret, service_account,
};
use xtask::harness::wait::{DEFAULT_TIMEOUT, Probe, wait_for};
use xtask::harness::{agent_binary, files_under, interrupt};

/// A narrated run of pod-checkpointer against a local control plane.
#[derive(clap::Args)]
pub(crate) struct Demo {
    /// How long a deleted parent's checkpoint is kept (the agent's --checkpoint-grace-period).
    #[arg(long, default_value = "2s")]
    grace_period: String,
}

/// Where the demo's pods live: where a self-hosted control plane's pods live.
const NAMESPACE: &str = "kube-system";
/// The demo's parent: a stand-in for a self-hosted API server (the kubelet is hollow, so no
/// process really runs).
const PARENT: &str = "kube-apiserver";

impl Demo {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        interrupt::install()?;
        // The agent and the control plane live inside `demo` and are stopped when it returns,
        // on success, on failure and on Ctrl-C alike.
        let outcome = self.demo();
        if interrupt::requested() {
            eprintln!("[demo] interrupted: everything the demo started is stopped and its work dir removed");
            std::process::exit(130);
        }
        outcome
    }

    fn demo(&self) -> anyhow::Result<()> {
        let say = Narrator::new();
        say.line("building what the demo runs: the control plane's binaries (cached after the first run, ~6 min cold) and the agent");
        let bins = e2e_env::ensure_built()?;
        crate::run("cargo", &["build", "-p", "ckpt-bin"])?;
        let agent_bin = agent_binary()?;

        say.line("starting etcd, kube-apiserver v1.20.2 and a hollow kubelet registered as node-1");
        let mut plane = ControlPlane::start(&StartOptions {
            hollow_node: true,
            ..StartOptions::new(bins)
        })?;
        let workdir = plane.workdir().to_owned();
        let static_pods = plane
            .static_pod_dir()
            .ok_or_else(|| anyhow::anyhow!("the plane has no hollow node"))?;
        let kubectl = Kubectl::new(&plane.kubeconfig(), &workdir.join("kubectl-cache"));
        let cri = CriClient::new(CRI_SOCKET);
        let expect = Expect {
            kubectl: &kubectl,
            cri: &cri,
            agent_bin: &agent_bin,
        };

        say.line(&format!(
            "granting the agent's identity (user `{AGENT_USER}`) in {NAMESPACE} the rules of the deploy manifests' Role (deploy/pod-checkpointer.yaml)"
        ));
        kubectl.apply(&[
            cluster_role("pod-checkpointer", &deployed_agent_rules()?),
            role_binding(NAMESPACE, "pod-checkpointer", "pod-checkpointer", AGENT_USER),
        ])?;

        say.line(&format!(
            "creating the checkpointer's own DaemonSet pod, and {NAMESPACE}/{PARENT} (annotation {CHECKPOINT_ANNOTATION}=true, restartPolicy Never) mounting Secret {PARENT}-certs and ConfigMap {PARENT}-config"
        ));
        kubectl.create(&service_account(NAMESPACE, CHECKPOINTER_SERVICE_ACCOUNT))?;
        let ds = kubectl.create(&daemon_set(NAMESPACE, "pod-checkpointer"))?;
        let me_name = format!("pod-checkpointer-{}", random_hex(3)?);
        kubectl.create(
            &PodBuilder::new(NAMESPACE, &me_name, NODE_NAME)
                .checkpointed()
                .owned_by(&Owner::of(&ds)?)
                .label("app", "pod-checkpointer")
                .service_account(CHECKPOINTER_SERVICE_ACCOUNT)
                .build(),
        )?;
        kubectl.create(&secret(
            NAMESPACE,
            &format!("{PARENT}-certs"),
            &[("tls.crt", "demo certificate\n"), ("tls.key", "demo key\n")],
        ))?;
        kubectl.create(&config_map(
            NAMESPACE,
            &format!("{PARENT}-config"),
            &[("config.yaml", "apiVersion: v1\nkind: Config\n")],
        ))?;
        let parent = PodBuilder::new(NAMESPACE, PARENT, NODE_NAME)
            .checkpointed()
            .restart_never()
            .mount_secret(&format!("{PARENT}-certs"))
            .mount_config_map(&format!("{PARENT}-config"));
        kubectl.create(&parent.build())?;
        let took = expect.api_pod_running(NAMESPACE, PARENT)?;
        say.line(&format!(
            "the kubelet runs {NAMESPACE}/{PARENT} ({} after it was created)",
            human_duration(took)
        ));

        let dirs = AgentDirs::under(&workdir.join("node-1"), &static_pods)?;
        let config = AgentConfig {
            label: "node-1".into(),
            node_name: NODE_NAME.into(),
            pod_name: me_name.clone(),
            pod_namespace: NAMESPACE.into(),
            kubeconfig: Some(plane.agent_kubeconfig()),
            kubelet_url: plane.kubelet_url().unwrap_or_default(),
            runtime_endpoint: format!("unix://{CRI_SOCKET}"),
            dirs: dirs.clone(),
            namespaces: vec![NAMESPACE.into()],
            gc_strategy: Some("grace-period".into()),
            grace_period: Some(self.grace_period.clone()),
        };
        let started = Instant::now();
        let mut agent = Agent::start(&agent_bin, &config, &workdir)?;
        say.line(&format!(
            "started `pod-checkpointer run` as node-1's checkpointer (pid {}, --gc-strategy grace-period --checkpoint-grace-period {}); its log: {}",
            agent.pid(),
            self.grace_period,
            agent.log_path().display()
        ));
        agent.wait_ready()?;

        // 1. Checkpoint written.
        expect.checkpoint(&dirs, NAMESPACE, PARENT, "state inactive and 3 data files", |c| {
            c.state == "inactive" && c.data_files == 3
        })?;
        say.step(
            "checkpoint written",
            started.elapsed(),
            "after the agent started; on node-1's disk:",
        );
        say.files(&dirs.checkpoint_dir);
        expect.checkpoint(&dirs, NAMESPACE, &me_name, "state active", |c| {
            c.state == "active"
        })?;
        let me_static = format!("{me_name}-{NODE_NAME}");
        expect.kubelet_runs(NAMESPACE, &me_static, DEFAULT_TIMEOUT)?;
        say.line(&format!(
            "the checkpointer checkpointed itself too: its static copy is always active in {} and the kubelet runs it as {NAMESPACE}/{me_static}",
            static_pods.display()
        ));
        let kept = dirs.checkpoint_dir.join("pod-checkpointer-kubeconfig");
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
        plane.kill_apiserver()?;
        cri.stop_pod(NAMESPACE, PARENT)?;
        expect.kubelet_stopped(NAMESPACE, PARENT)?;

        // 3. Activated, and run by the kubelet.
        let (active, _) =
            expect.checkpoint(&dirs, NAMESPACE, PARENT, "state active", |c| c.state == "active")?;
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
        expect.kubelet_runs(NAMESPACE, &static_parent, DEFAULT_TIMEOUT)?;
        say.step(
            "the kubelet runs the checkpoint",
            outage.elapsed(),
            &format!("after the outage, as static pod {NAMESPACE}/{static_parent}, without any API server"),
        );

        // 4. API server back.
        say.line("starting the API server again");
        let took = plane.restart_apiserver()?;
        say.step("API server back", took, "to /readyz 200");
        expect.api_pod(
            NAMESPACE,
            &static_parent,
            "present (mirror pod)",
            Duration::from_secs(90),
            |_| true,
        )?;
        let (old, _) = expect.api_pod(NAMESPACE, PARENT, "present", DEFAULT_TIMEOUT, |_| true)?;
        let state = agent::inspect(&agent_bin, &dirs)?
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
        kubectl.delete_now("pod", NAMESPACE, PARENT)?;
        expect.api_pod_gone(NAMESPACE, PARENT)?;
        let new_uid = kubectl::uid(&kubectl.create(&parent.build())?)?;
        expect.api_pod_running(NAMESPACE, PARENT)?;
        say.step(
            "the parent runs again",
            recreated.elapsed(),
            "after it was re-created",
        );
        expect.checkpoint(&dirs, NAMESPACE, PARENT, "state inactive and the new uid", |c| {
            c.state == "inactive" && c.parent_uid.as_deref() == Some(new_uid.as_str())
        })?;
        say.step(
            "checkpoint deactivated",
            recreated.elapsed(),
            "after the re-creation: the static pod file is gone, the inactive copy follows the new pod",
        );
        expect.kubelet_stopped(NAMESPACE, &static_parent)?;
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
        kubectl.delete_now("pod", NAMESPACE, PARENT)?;
        expect.no_checkpoint(&dirs, NAMESPACE, PARENT)?;
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
        plane.stop()?;
        say.line(&format!(
            "demo complete; the work dir {} is removed",
            workdir.display()
        ));
        Ok(())
    }
}

/// Narration on stderr, stamped with the time since the demo started.
struct Narrator {
    started: Instant,
}

impl Narrator {
    fn new() -> Narrator {
        Narrator {
            started: Instant::now(),
        }
    }

    fn line(&self, message: &str) {
        eprintln!("[demo {:>5.1} s] {message}", self.started.elapsed().as_secs_f64());
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
