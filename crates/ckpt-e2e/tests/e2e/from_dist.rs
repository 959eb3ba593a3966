//! Installed from `dist/` alone (issue 40): what a person who has never seen the project
//! does with what `cargo xtask release` publishes, and nothing else (no cargo, no
//! `deploy`, nothing edited): check the sums, import the image archive into the node's
//! containerd (`ctr images import --local --base-name … --digests`, as docs/release.md says), apply
//! the install YAML, which names the image by its index's digest. Then
//! the agent runs as the seed scenario's does (the DaemonSet copy holds the lock, its static
//! copy waits, the workload and the agent are checkpointed), and the documented uninstall
//! (docs/operations.md: delete the DaemonSet, then the rest) leaves nothing of ours. Then the
//! same with the release's Helm chart: `helm install` of the package (its default image the
//! same pin), the agent pair again, and the DaemonSet deleted before `helm uninstall`.
//!
//! The YAML's API server is the node-local one (`https://127.0.0.1:6443`, verified as
//! `kubernetes`), as on a self-hosted control-plane node. The plane here runs beside the
//! node, so a forwarder in the node's network namespace (socat, from 127.0.0.1:6443 to the
//! plane's API server) stands in for the node's own kube-apiserver; what the agent talks to
//! is still the real one, through its real serving certificate.

use std::fs;
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, Stdio};

use anyhow::Context;
use ckpt_e2e::image::Arch;
use ckpt_e2e::release::{self, ReleaseOptions};
use ckpt_render::{DEFAULT_API_SERVER, DEFAULT_IMAGE};

use crate::real_node::NodeRun;
use crate::real_node_seed::{
    AGENT_SELECTOR, NS, delete_objects, label_control_plane, reset, self_gc_after, wait_installed,
    wait_workload, workload_objects,
};

/// The release's image name: a tag of its own, so that importing it leaves the tag the other
/// scenarios deploy where it was (the YAML names the image by digest anyway).
fn release_reference() -> String {
    format!("{DEFAULT_IMAGE}-dist")
}

pub(crate) fn install_from_dist(run: &mut NodeRun) -> anyhow::Result<()> {
    let progress = run.progress;
    reset(run)?;
    label_control_plane(run)?;
    run.kubectl.apply(&workload_objects())?;
    let workload = wait_workload(run, "the workload's pod Running", |_| true)?;

    progress.say("the release, as `cargo xtask release` publishes it (amd64 and arm64)");
    let dist = run.plane.workdir().join("dist");
    let artifacts = release::build_release(&ReleaseOptions {
        reference: release_reference(),
        archs: Arch::ALL.to_vec(),
        output: dist.clone(),
    })?;
    let forwarder = NodeLocalApi::start(run)?;

    progress.say("the operator: `sha256sum --check`, `ctr images import`, `kubectl apply -f`");
    let sums = ckpt_e2e::command::run_command(
        Command::new("sha256sum")
            .args(["--check", "--strict", release::SUMS_FILE])
            .current_dir(&dist),
    )?;
    anyhow::ensure!(
        sums.lines().count() == artifacts.files.len() - 1,
        "sha256sum checked only:\n{sums}"
    );
    // As docs/release.md says: `--digests` also names the image by the index's digest, the
    // name the YAML's pin resolves to (a plain import names it by its tag alone, and the
    // kubelet then tries to pull the digest from the registry); `--local`, because
    // containerd 2's transfer service gives that name the digest of the archive's own
    // index.json instead.
    let pinned = release::pinned_reference(&release_reference(), &artifacts.image_digest)?;
    let (repository, _) = pinned
        .split_once('@')
        .context("a pinned reference has a digest")?;
    let archive = artifacts.archive.display().to_string();
    run.node.ctr(&[
        "images",
        "import",
        "--local",
        "--base-name",
        repository,
        "--digests",
        &archive,
    ])?;
    let yaml = artifacts.manifests.display().to_string();
    run.kubectl.run(&["apply", "-f", &yaml], None)?;

    runs_the_pin_until_its_daemonset_goes(run, &workload, &pinned, &artifacts.image_digest)?;
    run.kubectl.run(
        &["delete", "-f", &yaml, "--ignore-not-found", "--wait=true"],
        None,
    )?;

    // The same release through its Helm chart: the package's default image is the pin.
    let chart = artifacts.chart.display().to_string();
    progress.say(&format!(
        "the operator again, with helm: `helm install pod-checkpointer {} -n {NS}`",
        artifacts.chart.file_name().unwrap_or_default().to_string_lossy()
    ));
    let helm = Helm::new(run)?;
    helm.run(&["install", "pod-checkpointer", &chart, "--namespace", NS])?;
    runs_the_pin_until_its_daemonset_goes(run, &workload, &pinned, &artifacts.image_digest)?;
    helm.run(&["uninstall", "pod-checkpointer", "--namespace", NS, "--wait"])?;
    for (resource, name) in [
        ("configmap", "pod-checkpointer"),
        ("serviceaccount", "pod-checkpointer"),
    ] {
        anyhow::ensure!(
            run.kubectl.get(resource, NS, name)?.is_none(),
            "helm uninstall left {resource} {name}"
        );
    }
    drop(forwarder);
    run.node.ctr(&["images", "rm", &release_reference(), &pinned])?;
    fs::remove_dir_all(&dist).with_context(|| format!("cannot remove {}", dist.display()))?;
    delete_objects(run)
}

/// Waits for the installed agent (C1 holding the lock, its static copy, the workload and
/// itself checkpointed), checks that C1 runs the release's pinned image from the imported
/// archive, then uninstalls as docs/operations.md says: the DaemonSet first, and the agent
/// removes every checkpoint and itself while the rest of the install is still there.
fn runs_the_pin_until_its_daemonset_goes(
    run: &mut NodeRun,
    workload: &str,
    pinned: &str,
    image_digest: &str,
) -> anyhow::Result<()> {
    let (c1, _) = wait_installed(run, workload)?;
    let pod = run.kubectl.get("pod", NS, &c1)?.context("C1 is gone")?;
    let image = pod["spec"]["containers"][0]["image"].as_str().unwrap_or_default();
    let image_id = pod["status"]["containerStatuses"][0]["imageID"]
        .as_str()
        .unwrap_or_default();
    anyhow::ensure!(
        image == pinned && image_id.ends_with(image_digest),
        "C1 runs {image} (image ID {image_id}), not the release's {pinned}"
    );
    run.progress
        .say(&format!("C1 runs {pinned}, imported from the archive"));
    run.progress
        .say("uninstall as docs/operations.md says: the DaemonSet first, the rest once its pods are gone");
    self_gc_after(
        run,
        AGENT_SELECTOR,
        &["delete", "daemonset", "pod-checkpointer", "-n", NS],
        &[workload, &c1],
    )
}

/// helm (built from its Go module, cached) as the scenario's kubectl identity.
struct Helm {
    binary: std::path::PathBuf,
    kubeconfig: std::path::PathBuf,
}

impl Helm {
    fn new(run: &NodeRun) -> anyhow::Result<Helm> {
        Ok(Helm {
            binary: ckpt_e2e::e2e_env::modules::helm()?,
            kubeconfig: run.kubectl.kubeconfig().to_owned(),
        })
    }

    fn run(&self, args: &[&str]) -> anyhow::Result<String> {
        // Its caches and config beside the kubeconfig, not in the machine's $HOME.
        let home = self.kubeconfig.with_file_name("helm-home");
        ckpt_e2e::command::run_command(
            Command::new(&self.binary)
                .args(args)
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .env("HELM_CACHE_HOME", home.join("cache"))
                .env("HELM_CONFIG_HOME", home.join("config"))
                .env("HELM_DATA_HOME", home.join("data")),
        )
    }
}

/// socat in the node's network namespace, forwarding the YAML's API server address to the
/// plane's: the node-local API server of a self-hosted node. Stopped (its whole process
/// group, the connections it forked too) when dropped.
struct NodeLocalApi {
    child: Child,
}

impl NodeLocalApi {
    fn start(run: &NodeRun) -> anyhow::Result<NodeLocalApi> {
        let local = DEFAULT_API_SERVER
            .strip_prefix("https://")
            .context("the default API server is not https")?;
        let (host, port) = local
            .rsplit_once(':')
            .context("the default API server has no port")?;
        let plane = run
            .plane
            .apiserver_url()
            .strip_prefix("https://")
            .context("the plane's API server is not https")?
            .to_owned();
        let child = run
            .node
            .command("socat")
            .arg(format!("TCP-LISTEN:{port},bind={host},reuseaddr,fork"))
            .arg(format!("TCP:{plane}"))
            .stdin(Stdio::null())
            .process_group(0)
            .spawn()
            .context("cannot start socat in the node")?;
        let forwarder = NodeLocalApi { child };
        ckpt_e2e::wait::wait_for(
            &format!("socat listening on {local} in the node"),
            std::time::Duration::from_secs(10),
            || {
                let listening = run.node.exec(&["ss", "-Htln", &format!("sport = :{port}")])?;
                Ok(if listening.contains(local) {
                    ckpt_e2e::wait::Probe::Ready(())
                } else {
                    ckpt_e2e::wait::Probe::Waiting("not yet".to_owned())
                })
            },
        )?;
        Ok(forwarder)
    }
}

impl Drop for NodeLocalApi {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.child.wait();
    }
}
