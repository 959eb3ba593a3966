//! Issue 38, scenario 1: a full power cut of a self-hosted control plane on three nodes.
//!
//! The plane on the LAN bootstraps kube-apiserver (a DaemonSet: one per node, each on its
//! node's etcd member) and kube-controller-manager and kube-scheduler (Deployments of two) and
//! stops ([`SelfHosted::install`]); the agent is deployed through the nodes' API servers and
//! checkpoints every control-plane pod on every node. Then all three nodes lose power at once
//! and boot again. etcd has no quorum until two members are back, so every API server,
//! checkpoint or not, waits for it. Each cut is timed from the moment the last node's
//! processes are dead:
//!
//! - per node, its API server's first `/readyz` 200;
//! - cluster-wide, the first write that succeeds (through whichever node answers: a client
//!   that fails over), and the moment every real pod has replaced every checkpoint (the
//!   DaemonSet's pod Ready on each node, both Deployments' pods Ready, no control-plane
//!   checkpoint active on any node).
//!
//! Afterwards a ConfigMap written before the cut reads back, and no node's agent has set a
//! revision aside: an API server that waits for a quorum is not a revision that fails. CI
//! cuts once; the longer mode ([`LONG_CUTS`]) gives the series BENCHMARKS.md records.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use ckpt_e2e::e2e_env;
use ckpt_e2e::harness::agent::{AgentDirs, Inspect, inspect};
use ckpt_e2e::harness::kubectl::{Kubectl, pod_running};
use ckpt_e2e::harness::{agent_binary, xtask_binary};
use ckpt_e2e::process::random_hex;
use ckpt_e2e::progress::human_duration;
use ckpt_e2e::self_hosted::objects::{APISERVER, CONTROLLER_MANAGER, SCHEDULER};
use ckpt_e2e::self_hosted::{SelfHosted, pods_of};
use ckpt_e2e::wait::{Probe, wait_for, waiting_on_error};
use serde_json::Value;

use crate::failover::FailoverWriter;
use crate::real_node_seed::is_mirror;
use crate::three_nodes::ClusterRun;

pub(crate) const NS: &str = "kube-system";
pub(crate) const COMPONENTS: [&str; 3] = [APISERVER, CONTROLLER_MANAGER, SCHEDULER];
const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";
/// Three API servers waiting for a quorum, then for their parents: generous.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(300);
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// Full cuts in the longer mode (`E2E_LONG=1`); CI cuts once.
const LONG_CUTS: usize = 5;
/// The agent's GC grace period here: longer than any recovery, so nothing is collected.
const GRACE_PERIOD: &str = "10m";

/// The self-hosted control plane of the run, pivoted to (with the agent deployed and every
/// control-plane pod checkpointed) by the first scenario that needs it.
pub(crate) fn ensure_self_hosted(run: &mut ClusterRun) -> anyhow::Result<SelfHosted> {
    if let Some(self_hosted) = &run.self_hosted {
        return Ok(self_hosted.clone());
    }
    for node in &run.nodes {
        run.kubectl.run(
            &[
                "label",
                "node",
                node.name(),
                &format!("{CONTROL_PLANE_LABEL}="),
                "--overwrite",
            ],
            None,
        )?;
    }
    let bins = e2e_env::cached_bins(e2e_env::Release::from_env()?)?;
    let self_hosted = SelfHosted::install(&mut run.plane, &mut run.nodes, &bins)?;
    run.kubectl = self_hosted.kubectl().clone();
    deploy(run, &self_hosted, &[])?;
    wait_checkpointed(run)?;
    run.self_hosted = Some(self_hosted.clone());
    Ok(self_hosted)
}

/// The pivot to a self-hosted control plane on the three nodes, the agent deployed through
/// it, then full power cuts, each timed.
pub(crate) fn full_power_cut(run: &mut ClusterRun) -> anyhow::Result<()> {
    let progress = run.progress;
    let self_hosted = ensure_self_hosted(run)?;
    if crate::long_mode() {
        report_cost_at_rest(run)?;
    }
    let cuts = if crate::long_mode() { LONG_CUTS } else { 1 };
    let mut timelines = Vec::new();
    for n in 1..=cuts {
        let marker = format!("before-cut-{n}-{}", random_hex(4)?);
        run.kubectl.run(
            &[
                "create",
                "configmap",
                "-n",
                NS,
                &marker,
                &format!("--from-literal=value={marker}"),
            ],
            None,
        )?;
        let timeline = cut_all_once(run, &self_hosted, n)?;
        progress.say(&format!("cut {n}: {}", timeline.line()));
        if crate::demo_mode() {
            timeline.narrate();
        }
        let read = run
            .kubectl
            .get("configmap", NS, &marker)?
            .with_context(|| format!("the ConfigMap {marker} written before cut {n} is gone"))?;
        anyhow::ensure!(
            read["data"]["value"] == marker.as_str(),
            "the ConfigMap {marker} reads back as {}",
            read["data"]
        );
        for node in &run.nodes {
            let report = inspect_node(node)?;
            let set_aside = set_aside(&report);
            anyhow::ensure!(
                set_aside.is_empty(),
                "{}'s agent set revisions aside after cut {n} (waiting for a quorum is no failure): {set_aside:?}",
                node.name()
            );
        }
        timelines.push(timeline);
    }
    report(run, &timelines);
    Ok(())
}

/// `cargo xtask deploy … EXTRA` through the first node's API server, from the LAN: the agent
/// on every node talks to its node's own API server (render's default).
pub(crate) fn deploy(run: &ClusterRun, self_hosted: &SelfHosted, extra: &[&str]) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut command = run.plane.command(xtask_binary()?);
    command
        .arg("deploy")
        .arg("--kubeconfig")
        .arg(self_hosted.kubeconfig())
        .args(["--gc-strategy", "grace-period", "--grace-period", GRACE_PERIOD])
        .args(["--timeout", "3m"])
        .args(extra);
    eprintln!(
        "$ cargo xtask deploy --gc-strategy grace-period --grace-period {GRACE_PERIOD} {} (in the LAN's namespace)",
        extra.join(" ")
    );
    let status = command.status().context("cannot run xtask deploy")?;
    anyhow::ensure!(status.success(), "cargo xtask deploy failed: {status}");
    run.progress.say(&format!(
        "deploy returned (rollout complete on {} nodes) in {}",
        run.nodes.len(),
        human_duration(started.elapsed())
    ));
    Ok(())
}

/// Waits until on every node each control-plane pod that runs there has an inactive
/// checkpoint, and the agent's static copy holds the lock.
fn wait_checkpointed(run: &ClusterRun) -> anyhow::Result<()> {
    for node in &run.nodes {
        let ((), _) = wait_for(
            &format!("{}'s control-plane pods checkpointed", node.name()),
            TIMEOUT,
            || {
                waiting_on_error((|| {
                    let pods = control_plane_pods(&run.kubectl, node.name())?;
                    let report = inspect_node(node)?;
                    let missing: Vec<&String> = pods
                        .iter()
                        .filter(|pod| {
                            report
                                .get(&format!("{NS}/{pod}"))
                                .is_none_or(|c| c.state != "inactive")
                        })
                        .collect();
                    Ok(
                        if !pods.is_empty() && missing.is_empty() && report.lock_holder.is_some() {
                            Probe::Ready(())
                        } else {
                            Probe::Waiting(format!(
                                "pods {pods:?}, not yet inactive {missing:?}: {}",
                                report.summary()
                            ))
                        },
                    )
                })())
            },
        )?;
    }
    run.progress
        .say("every control-plane pod on every node has an inactive checkpoint");
    Ok(())
}

/// The names of the running (non-mirror) control-plane pods on `node`.
fn control_plane_pods(kubectl: &Kubectl, node: &str) -> anyhow::Result<Vec<String>> {
    let mut names = Vec::new();
    for app in COMPONENTS {
        for pod in pods_of(kubectl, app)? {
            if !is_mirror(&pod) && pod["spec"]["nodeName"] == node && pod_running(&pod) {
                names.push(pod["metadata"]["name"].as_str().unwrap_or_default().to_owned());
            }
        }
    }
    Ok(names)
}

/// How long the self-hosted cluster is watched at rest for its cost.
const AT_REST: Duration = Duration::from_secs(60);

/// What the self-hosted cluster costs at rest: the machine's busy CPU over [`AT_REST`] (the
/// whole machine: nothing else runs but this test, which sleeps), and the resident memory
/// of every process of each node (its daemons and containers: kube-apiserver, the
/// controllers, the agent).
fn report_cost_at_rest(run: &ClusterRun) -> anyhow::Result<()> {
    let before = machine_cpu()?;
    std::thread::sleep(AT_REST);
    let after = machine_cpu()?;
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get) as f64;
    let total = after.0.saturating_sub(before.0).max(1) as f64;
    let busy = after.1.saturating_sub(before.1) as f64;
    let mut nodes = Vec::new();
    let mut sum = 0.0;
    for node in &run.nodes {
        let mib: f64 = node
            .processes()
            .into_iter()
            .filter_map(ckpt_e2e::process::rss_kib)
            .sum::<u64>() as f64
            / 1024.0;
        sum += mib;
        nodes.push(format!("{} {mib:.0} MiB", node.name()));
    }
    run.progress.say(&format!(
        "the self-hosted cluster at rest over {}: {:.2} of {cores:.0} cores busy (the whole machine); resident: {} (each node's daemons and containers), {:.2} GiB in all",
        human_duration(AT_REST),
        busy / total * cores,
        nodes.join(", "),
        sum / 1024.0
    ));
    Ok(())
}

/// The machine's CPU time so far, in ticks: all of it, and the busy part (not idle, not
/// waiting for I/O), from `/proc/stat`.
fn machine_cpu() -> anyhow::Result<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").context("cannot read /proc/stat")?;
    let line = stat.lines().next().context("an empty /proc/stat")?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    anyhow::ensure!(ticks.len() >= 5, "an odd /proc/stat line: {line}");
    let total: u64 = ticks.iter().sum();
    Ok((total, total - ticks[3] - ticks[4]))
}

/// The agent's dirs on `node` (its defaults), seen from the host.
pub(crate) fn agent_dirs(node: &e2e_env::RealNode) -> anyhow::Result<AgentDirs> {
    let host = |path: &str| {
        node.host_path(path)
            .with_context(|| format!("{path} is not one of {}'s own dirs", node.name()))
    };
    Ok(AgentDirs {
        checkpoint_dir: host("/etc/kubernetes")?,
        manifests_dir: host("/etc/kubernetes/manifests")?,
        lock_file: host("/run/pod-checkpointer/pod-checkpointer.lock")?,
    })
}

/// `pod-checkpointer inspect` on `node`'s dirs, seen from the host.
pub(crate) fn inspect_node(node: &e2e_env::RealNode) -> anyhow::Result<Inspect> {
    inspect(&agent_binary()?, &agent_dirs(node)?)
}

/// The checkpoints in `report` whose revision the agent set aside (their known-good mark
/// suspended: they crash-looped while active).
pub(crate) fn set_aside(report: &Inspect) -> Vec<&str> {
    report
        .checkpoints
        .iter()
        .filter(|c| c.known_good_suspended_since.is_some())
        .map(|c| c.pod.as_str())
        .collect()
}

/// Whether `pod` (`namespace/name`) is one of kube-apiserver's: its pods or their
/// checkpoints.
pub(crate) fn is_apiserver(pod: &str) -> bool {
    pod.starts_with(&format!("{NS}/{APISERVER}"))
}

/// The kube-apiserver checkpoints active in `report`.
pub(crate) fn active_apiserver(report: &Inspect) -> Vec<String> {
    active_control_plane(report)
        .into_iter()
        .filter(|pod| is_apiserver(pod))
        .collect()
}

/// The control-plane checkpoints active in `report` (the agent's own is active by design).
pub(crate) fn active_control_plane(report: &Inspect) -> Vec<String> {
    report
        .checkpoints
        .iter()
        .filter(|c| {
            c.state.starts_with("active")
                && COMPONENTS
                    .iter()
                    .any(|app| c.pod.starts_with(&format!("{NS}/{app}")))
        })
        .map(|c| c.pod.clone())
        .collect()
}

/// What one full cut took, each from the cut.
struct CutTimeline {
    /// How long the three boots took (containerd, the etcd member and the kubelet of each,
    /// one node after the other).
    booted: Duration,
    /// Per node: the first sample with a control-plane checkpoint active.
    activated: BTreeMap<String, Duration>,
    /// Per node: its API server's first `/readyz` 200.
    api_ready: BTreeMap<String, Duration>,
    /// The first write that succeeded through any node.
    first_write: Duration,
    /// Every real pod Ready in place of every checkpoint.
    parents_back: Duration,
}

impl CutTimeline {
    fn line(&self) -> String {
        let nodes: Vec<String> = self
            .api_ready
            .iter()
            .map(|(node, took)| format!("{node} API {}", human_duration(*took)))
            .collect();
        format!(
            "{}; first write {}; every parent back {}",
            nodes.join(", "),
            human_duration(self.first_write),
            human_duration(self.parents_back)
        )
    }

    /// The demo's account of the cut: each milestone, from the moment all three nodes were
    /// off, with what it means.
    fn narrate(&self) {
        let at = |took: Duration| format!("{:>7}", human_duration(took));
        let mut lines = vec![(
            self.booted,
            "power is back on every node: containerd, the etcd member and the kubelet of each run; \
             the kubelets, pointed at their own node's API server, find none and start their static pods \
             only: the agent's static copy"
                .to_owned(),
        )];
        for (node, took) in &self.activated {
            lines.push((
                *took,
                format!(
                    "{node}: its agent finds no API server and activates the control plane's checkpoints"
                ),
            ));
        }
        lines.push((
            self.first_write,
            "the first write succeeds: two etcd members make a quorum, and a checkpointed kube-apiserver \
             serves it (a client that fails over between the three addresses)"
                .to_owned(),
        ));
        for (node, took) in &self.api_ready {
            lines.push((*took, format!("{node}: its API server answers /readyz 200")));
        }
        lines.push((
            self.parents_back,
            "every real pod has replaced every checkpoint: kube-apiserver's DaemonSet pod Ready on each node, \
             both Deployments' pods Ready, no control-plane checkpoint active anywhere"
                .to_owned(),
        ));
        lines.sort_by_key(|(took, _)| *took);
        eprintln!("\nthe full power cut, from the moment all three nodes were off:");
        for (took, what) in lines {
            eprintln!("  {}  {what}", at(took));
        }
    }
}

/// Cuts all three nodes at once, powers them on, and samples until every milestone is
/// reached.
fn cut_all_once(run: &mut ClusterRun, self_hosted: &SelfHosted, n: usize) -> anyhow::Result<CutTimeline> {
    // Writing throughout: the first write that succeeds after the cut is when the cluster
    // takes writes again (a quorum, and an API server to take them), seen from a client.
    let writer = FailoverWriter::start(&run.kubectl, self_hosted)?;
    run.progress
        .say(&format!("cut {n}: all {} nodes lose power", run.nodes.len()));
    for node in &mut run.nodes {
        node.cut_power()?;
    }
    let cut = Instant::now();
    for node in &mut run.nodes {
        node.power_on()?;
    }
    let booted = cut.elapsed();
    let urls: Vec<(String, String)> = run
        .nodes
        .iter()
        .zip(self_hosted.apis())
        .map(|(node, url)| (node.name().to_owned(), url.to_owned()))
        .collect();
    let mut api_ready: BTreeMap<String, Duration> = BTreeMap::new();
    let mut activated: BTreeMap<String, Duration> = BTreeMap::new();
    let parents_back = loop {
        anyhow::ensure!(
            cut.elapsed() < TIMEOUT,
            "cut {n}: not back within {}: APIs ready {api_ready:?}, agents activated {activated:?}",
            human_duration(TIMEOUT)
        );
        let round = Instant::now();
        // At once: a server waiting for a quorum holds each probe for its whole timeout, and
        // one after the other they would stretch the round (and blur every milestone).
        let serving: Vec<bool> = std::thread::scope(|scope| {
            let probes: Vec<_> = urls
                .iter()
                .map(|(_, url)| scope.spawn(move || self_hosted.readyz_of(url) == 200))
                .collect();
            probes
                .into_iter()
                .map(|probe| probe.join().unwrap_or(false))
                .collect()
        });
        for ((node, _), serving) in urls.iter().zip(serving) {
            if serving {
                api_ready.entry(node.clone()).or_insert(cut.elapsed());
            }
        }
        let mut active = false;
        for node in &run.nodes {
            if !active_control_plane(&inspect_node(node)?).is_empty() {
                active = true;
                activated.entry(node.name().to_owned()).or_insert(cut.elapsed());
            }
        }
        if api_ready.len() == urls.len()
            && !active
            && !activated.is_empty()
            && parents_ready(&run.kubectl, run.nodes.len())?
        {
            break cut.elapsed();
        }
        std::thread::sleep(SAMPLE_EVERY.saturating_sub(round.elapsed()));
    };
    let writes = writer.stop()?;
    let first_write = writes
        .first_success_after(cut)
        .with_context(|| format!("cut {n}: no write succeeded after it: {}", writes.summary()))?;
    Ok(CutTimeline {
        booted,
        activated,
        api_ready,
        first_write,
        parents_back,
    })
}

/// Whether the DaemonSet has a Ready pod on each of the `nodes` and both Deployments all
/// their replicas Ready (through whichever API server answers).
pub(crate) fn parents_ready(kubectl: &Kubectl, nodes: usize) -> anyhow::Result<bool> {
    let ready = |object: Option<Value>, field: &str, wanted: u64| {
        object.is_some_and(|o| o["status"][field].as_u64() == Some(wanted))
    };
    let Ok(daemonset) = kubectl.get("daemonset", NS, APISERVER) else {
        return Ok(false);
    };
    if !ready(daemonset, "numberReady", nodes as u64) {
        return Ok(false);
    }
    for deployment in [CONTROLLER_MANAGER, SCHEDULER] {
        let Ok(object) = kubectl.get("deployment", NS, deployment) else {
            return Ok(false);
        };
        let replicas = object
            .as_ref()
            .and_then(|o| o["spec"]["replicas"].as_u64())
            .unwrap_or(1);
        if !ready(object, "readyReplicas", replicas) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Min / median / max of each milestone over the cuts.
fn report(run: &ClusterRun, cuts: &[CutTimeline]) {
    let stats = |mut values: Vec<Duration>| {
        values.sort();
        format!(
            "min {} / median {} / max {}",
            human_duration(values[0]),
            human_duration(values[values.len() / 2]),
            human_duration(values[values.len() - 1])
        )
    };
    if cuts.is_empty() {
        return;
    }
    for node in &run.nodes {
        let activated = |cut: &CutTimeline| cut.activated.get(node.name()).copied();
        let api_ready = |cut: &CutTimeline| cut.api_ready.get(node.name()).copied();
        for (what, values) in [
            (
                "its agent activating",
                cuts.iter().filter_map(activated).collect::<Vec<_>>(),
            ),
            (
                "its API server serving",
                cuts.iter().filter_map(api_ready).collect(),
            ),
        ] {
            if values.is_empty() {
                continue;
            }
            run.progress.say(&format!(
                "{} full cut(s), {}: {what} {} (in {} of them)",
                cuts.len(),
                node.name(),
                stats(values.clone()),
                values.len()
            ));
        }
    }
    run.progress.say(&format!(
        "{} full cut(s), the boots: {}",
        cuts.len(),
        stats(cuts.iter().map(|c| c.booted).collect())
    ));
    run.progress.say(&format!(
        "{} full cut(s), first write: {}",
        cuts.len(),
        stats(cuts.iter().map(|c| c.first_write).collect())
    ));
    run.progress.say(&format!(
        "{} full cut(s), every parent back: {}",
        cuts.len(),
        stats(cuts.iter().map(|c| c.parents_back).collect())
    ));
}
