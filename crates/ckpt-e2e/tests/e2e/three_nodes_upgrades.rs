//! Issue 38, scenarios 4 and 5, on the self-hosted control plane of three nodes (see
//! [`ensure_self_hosted`]), in the longer mode (`E2E_LONG=1`):
//!
//! - kube-apiserver's DaemonSet upgraded, first to a good spec, which walks the nodes one at
//!   a time with the agent's handoff on each, then to a bad one (a flag kube-apiserver
//!   rejects), which stops at the first node: its known-good checkpoint serves, the
//!   DaemonSet controller waits on the unready pod instead of taking the next node, and a
//!   rollback brings every node to the good spec. A failover client writes throughout and
//!   must never fail for longer than the failover.
//! - the agent's own upgrade (a new image tag, `deploy`'s surge) across the three nodes: at
//!   every sample each node keeps every control-plane checkpoint and a self-checkpoint.

use std::collections::{BTreeMap, BTreeSet};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::Context;
use ckpt_e2e::harness::agent::{AgentDirs, inspect};
use ckpt_e2e::harness::agent_binary;
use ckpt_e2e::harness::kubectl::pod_running;
use ckpt_e2e::progress::human_duration;
use ckpt_e2e::self_hosted::objects::APISERVER;
use ckpt_e2e::self_hosted::{SelfHosted, pods_of};
use ckpt_e2e::wait::{Probe, wait_for, waiting_on_error};
use serde_json::{Value, json};

use crate::failover::FailoverWriter;
use crate::real_node_seed::{is_mirror, is_ready};
use crate::self_hosted::patch_apiserver;
use crate::three_nodes::ClusterRun;
use crate::three_nodes_cut::{
    NS, SAMPLE_EVERY, TIMEOUT, active_apiserver, active_control_plane, agent_dirs, deploy,
    ensure_self_hosted, inspect_node, is_apiserver, parents_ready,
};

/// What the good upgrade changes: an environment variable, which kube-apiserver ignores.
const GOOD_ENV: &str = "E2E_UPGRADE";
/// The flag the bad upgrade adds: kube-apiserver exits at once on an unknown flag.
const BAD_FLAG: &str = "--no-such-flag=true";
/// How long the bad rollout is watched for a second node it must not take.
const HALTED_FOR: Duration = Duration::from_secs(60);

/// Scenario 4: a good, then a bad kube-apiserver upgrade, then the rollback.
pub(crate) fn apiserver_upgrades(run: &mut ClusterRun) -> anyhow::Result<()> {
    let self_hosted = ensure_self_hosted(run)?;
    let writer = FailoverWriter::start(&run.kubectl, &self_hosted)?;
    let outcome = upgrades(run, &self_hosted);
    let writes = writer.stop();
    outcome?;
    let writes = writes?;
    run.progress
        .say(&format!("the failover client: {}", writes.summary()));
    writes.ensure_within_bound("during the upgrades")?;
    Ok(())
}

fn upgrades(run: &mut ClusterRun, self_hosted: &SelfHosted) -> anyhow::Result<()> {
    let progress = run.progress;
    let nodes = run.nodes.len();

    progress.say(&format!(
        "a good upgrade of kube-apiserver's DaemonSet ({GOOD_ENV} set): it walks the {nodes} nodes"
    ));
    let started = Instant::now();
    patch_apiserver(
        &run.kubectl,
        &json!([{
            "op": "add",
            "path": "/spec/template/spec/containers/0/env/-",
            "value": { "name": GOOD_ENV, "value": "good" },
        }]),
    )?;
    let handed_over = wait_rolled_out(run, self_hosted, |pod| {
        env_of(pod, GOOD_ENV).as_deref() == Some("good")
    })?;
    progress.say(&format!(
        "the good upgrade rolled out in {}; the nodes whose checkpoint served during the handoff: {handed_over:?}",
        human_duration(started.elapsed())
    ));

    // The bad upgrade's protection is the last known-good revision: wherever the bad pod
    // lands, the good pod it replaces must have proved itself (Ready for a minute) first.
    // Without that mark the agent has no revision better than the newest one to start.
    let good = wait_known_good(run, |pod| env_of(pod, GOOD_ENV).as_deref() == Some("good"))?;
    progress.say(&format!(
        "known-good on every node: {}",
        good.values().cloned().collect::<Vec<_>>().join(", ")
    ));
    progress.say(&format!(
        "a bad upgrade ({BAD_FLAG}): it must stop at the first node"
    ));
    patch_apiserver(
        &run.kubectl,
        &json!([{
            "op": "add",
            "path": "/spec/template/spec/containers/0/command/-",
            "value": BAD_FLAG,
        }]),
    )?;
    let bad_started = Instant::now();
    let mut bad_nodes = BTreeSet::new();
    while bad_started.elapsed() < HALTED_FOR {
        let round = Instant::now();
        for pod in pods_of(&run.kubectl, APISERVER).unwrap_or_default() {
            if is_bad(&pod) {
                bad_nodes.insert(target_node(&pod));
            }
        }
        anyhow::ensure!(
            bad_nodes.len() <= 1,
            "the bad rollout took a second node: {bad_nodes:?} (it must wait on the first one's unready pod)"
        );
        thread::sleep(SAMPLE_EVERY.saturating_sub(round.elapsed()));
    }
    let bad_node = bad_nodes
        .into_iter()
        .next()
        .context("the bad upgrade reached no node")?;
    let index = run
        .nodes
        .iter()
        .position(|node| node.name() == bad_node)
        .context("the bad pod is on an unknown node")?;
    let url = self_hosted.apis().nth(index).context("no API server")?.to_owned();
    let known_good = format!(
        "{NS}/{}",
        good.get(&bad_node)
            .with_context(|| format!("no good pod was seen on {bad_node}"))?
    );
    // Each restart of the bad pod's container may take the shared port for a moment: the
    // node must serve through its known-good checkpoint within a minute of samples, not at
    // one instant. No other kube-apiserver checkpoint (the bad pod's) may be active there.
    wait_for(
        &format!("{bad_node}'s API server serving through its known-good checkpoint {known_good}"),
        Duration::from_secs(60),
        || {
            let report = inspect_node(&run.nodes[index])?;
            let active = active_control_plane(&report);
            let apiservers = active_apiserver(&report);
            anyhow::ensure!(
                apiservers.iter().all(|pod| *pod == known_good),
                "{bad_node}: a kube-apiserver checkpoint other than the known-good {known_good} is active: {apiservers:?}"
            );
            Ok(match (self_hosted.readyz_of(&url), apiservers.is_empty()) {
                (200, false) => Probe::Ready(()),
                (status, _) => Probe::Waiting(format!("/readyz {status}, active checkpoints {active:?}")),
            })
        },
    )?;
    progress.say(&format!(
        "the bad rollout stopped at {bad_node} for {}: its known-good checkpoint {known_good} serves, the other nodes kept the good pods",
        human_duration(HALTED_FOR)
    ));

    progress.say("rollback: `kubectl rollout undo daemonset/kube-apiserver`");
    let rollback = Instant::now();
    run.kubectl
        .run(&["rollout", "undo", "daemonset", APISERVER, "-n", NS], None)?;
    wait_rolled_out(run, self_hosted, |pod| {
        !is_bad(pod) && env_of(pod, GOOD_ENV).as_deref() == Some("good")
    })?;
    progress.say(&format!(
        "after the rollback every node runs the good spec again, {} after the undo",
        human_duration(rollback.elapsed())
    ));
    Ok(())
}

/// Waits until every node runs a Ready kube-apiserver pod for which `wanted` holds, the
/// DaemonSet counts them all updated and ready, and no node has a control-plane checkpoint
/// active; returns the nodes whose kube-apiserver checkpoint was seen active on the way (the
/// handoffs).
pub(crate) fn wait_rolled_out(
    run: &ClusterRun,
    self_hosted: &SelfHosted,
    wanted: impl Fn(&Value) -> bool,
) -> anyhow::Result<BTreeSet<String>> {
    let started = Instant::now();
    let mut handed_over = BTreeSet::new();
    loop {
        let round = Instant::now();
        anyhow::ensure!(
            started.elapsed() < TIMEOUT,
            "the rollout did not complete within {}; handoffs seen on {handed_over:?}",
            human_duration(TIMEOUT)
        );
        let mut any_active = false;
        for node in &run.nodes {
            let active = active_control_plane(&inspect_node(node)?);
            if active.iter().any(|pod| is_apiserver(pod)) {
                handed_over.insert(node.name().to_owned());
            }
            any_active |= !active.is_empty();
        }
        let pods = pods_of(&run.kubectl, APISERVER).unwrap_or_default();
        let on_node: BTreeMap<String, bool> = pods
            .iter()
            .filter(|pod| !is_mirror(pod))
            .map(|pod| {
                let ready = pod_running(pod) && is_ready(pod) && wanted(pod);
                (
                    pod["spec"]["nodeName"].as_str().unwrap_or_default().to_owned(),
                    ready,
                )
            })
            .collect();
        let all_wanted = run
            .nodes
            .iter()
            .all(|node| on_node.get(node.name()).copied().unwrap_or(false));
        if all_wanted
            && !any_active
            && self_hosted.apis().all(|url| self_hosted.readyz_of(url) == 200)
            && parents_ready(&run.kubectl, run.nodes.len()).unwrap_or(false)
        {
            return Ok(handed_over);
        }
        thread::sleep(SAMPLE_EVERY.saturating_sub(round.elapsed()));
    }
}

/// Waits until each node's kube-apiserver checkpoint of its pod for which `wanted` holds is
/// known-good in that node's `inspect`; returns those pods' names by node.
pub(crate) fn wait_known_good(
    run: &ClusterRun,
    wanted: impl Fn(&Value) -> bool,
) -> anyhow::Result<BTreeMap<String, String>> {
    let (good, _) = wait_for(
        "every node's kube-apiserver checkpoint known-good",
        TIMEOUT,
        || {
            waiting_on_error((|| {
                let pods = pods_of(&run.kubectl, APISERVER)?;
                let by_node: BTreeMap<String, String> = (pods.iter())
                    .filter(|pod| !is_mirror(pod) && wanted(pod))
                    .map(|pod| (target_node(pod), crate::real_node_seed::name_of(pod)))
                    .collect();
                let mut missing = Vec::new();
                for node in &run.nodes {
                    let proven = by_node.get(node.name()).is_some_and(|pod| {
                        inspect_node(node).is_ok_and(|report| {
                            report.get(&format!("{NS}/{pod}")).is_some_and(|c| c.known_good)
                        })
                    });
                    if !proven {
                        missing.push(format!("{}: {:?}", node.name(), by_node.get(node.name())));
                    }
                }
                Ok(if missing.is_empty() {
                    Probe::Ready(by_node)
                } else {
                    Probe::Waiting(format!("not known-good yet: {}", missing.join(", ")))
                })
            })())
        },
    )?;
    Ok(good)
}

/// Scenario 5: the agent's own upgrade to a new image tag across the three nodes; at every
/// sample, every node keeps each control-plane checkpoint it had and a self-checkpoint.
pub(crate) fn agent_upgrade(run: &mut ClusterRun) -> anyhow::Result<()> {
    let self_hosted = ensure_self_hosted(run)?;
    let before: Vec<BTreeSet<String>> = run
        .nodes
        .iter()
        .map(|node| Ok(control_plane_checkpoints(&inspect_node(node)?)))
        .collect::<anyhow::Result<_>>()?;
    let image = crate::real_node_seed::upgrade_image();
    run.progress.say(&format!(
        "`cargo xtask deploy --image {image}` on the {} nodes; each node's checkpoints watched",
        run.nodes.len()
    ));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let missing = {
        let nodes: Vec<(String, AgentDirs)> = run
            .nodes
            .iter()
            .map(|node| Ok((node.name().to_owned(), agent_dirs(node)?)))
            .collect::<anyhow::Result<_>>()?;
        let agent = agent_binary()?;
        let before = before.clone();
        let stop = std::sync::Arc::clone(&stop);
        thread::spawn(move || -> anyhow::Result<usize> {
            let mut samples = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                samples += 1;
                for ((name, dirs), had) in nodes.iter().zip(&before) {
                    let report = inspect(&agent, dirs)?;
                    let now = control_plane_checkpoints(&report);
                    let lost: Vec<&String> = had.difference(&now).collect();
                    anyhow::ensure!(
                        lost.is_empty(),
                        "{name} lost checkpoints during the upgrade: {lost:?}"
                    );
                    anyhow::ensure!(
                        report
                            .checkpoints
                            .iter()
                            .any(|c| c.pod.starts_with(&format!("{NS}/pod-checkpointer"))),
                        "{name} had no self-checkpoint at one moment of the upgrade"
                    );
                }
                thread::sleep(SAMPLE_EVERY);
            }
            Ok(samples)
        })
    };
    let upgraded = deploy(run, &self_hosted, &["--image", &image]).and_then(|()| {
        wait_for(&format!("every agent pod on {image}"), TIMEOUT, || {
            waiting_on_error((|| {
                let pods = run.kubectl.pods(NS, crate::real_node_seed::AGENT_SELECTOR)?;
                let on_image = pods
                    .iter()
                    .filter(|pod| pod_running(pod) && pod["spec"]["containers"][0]["image"] == image.as_str())
                    .count();
                Ok(if pods.len() == 2 * run.nodes.len() && on_image == pods.len() {
                    Probe::Ready(())
                } else {
                    Probe::Waiting(format!(
                        "{on_image} of {} agent pods on the new image",
                        pods.len()
                    ))
                })
            })())
        })
        .map(drop)
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let samples = missing
        .join()
        .map_err(|_| anyhow::anyhow!("the checkpoint watch panicked"))?;
    upgraded?;
    let samples = samples?;
    run.progress.say(&format!(
        "every node runs the agent on {image} (DaemonSet and static copies); {samples} samples, no checkpoint missing on any node"
    ));
    Ok(())
}

/// The control-plane checkpoints of a report (the agent's own excluded).
fn control_plane_checkpoints(report: &ckpt_e2e::harness::agent::Inspect) -> BTreeSet<String> {
    report
        .checkpoints
        .iter()
        .filter(|c| !c.pod.starts_with(&format!("{NS}/pod-checkpointer")))
        .map(|c| c.pod.clone())
        .collect()
}

fn is_bad(pod: &Value) -> bool {
    pod["spec"]["containers"][0]["command"]
        .as_array()
        .is_some_and(|command| command.iter().any(|arg| arg == BAD_FLAG))
}

/// The node a DaemonSet's pod is for: its node affinity names it before the pod is bound
/// (`spec.nodeName` is empty until then).
fn target_node(pod: &Value) -> String {
    let terms = &pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
    let by_affinity = terms.as_array().into_iter().flatten().find_map(|term| {
        term["matchFields"].as_array()?.iter().find_map(|field| {
            (field["key"] == "metadata.name").then(|| field["values"][0].as_str().map(str::to_owned))?
        })
    });
    by_affinity.unwrap_or_else(|| pod["spec"]["nodeName"].as_str().unwrap_or_default().to_owned())
}

pub(crate) fn env_of(pod: &Value, name: &str) -> Option<String> {
    pod["spec"]["containers"][0]["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str().map(str::to_owned))
}
