//! The seed scenarios on the real node (issue 16): the agent installed from its image by
//! `cargo xtask deploy` exactly as an operator of this node would (the render options are the
//! node's API endpoint and a short grace period, nothing edited by hand), the static copy
//! started by the kubelet from the agent's own checkpoint, a power cut with the API server
//! down, the way back, the agent's own upgrade, and self-GC once the DaemonSet no longer
//! targets the node. The seed deploys with `--prometheus` and judges the deployed alerts on
//! the active copy's metrics, healthy and in the power cut.
//!
//! Everything here is observed as an operator would: the API, the node's files (its
//! manifests and checkpoint dirs, its container logs under `/var/log/pods`), and
//! `pod-checkpointer inspect` and `health` pointed at them.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::Context;
use ckpt_e2e::e2e_env::NODE_NAME;
use ckpt_e2e::harness::agent::{AgentDirs, Inspect, inspect};
use ckpt_e2e::harness::kubectl::pod_running;
use ckpt_e2e::harness::lock::{Holding, LockTimeline, LockWatch, lock_holder};
use ckpt_e2e::harness::objects::prometheus_operator_crds;
use ckpt_e2e::harness::{agent_binary, xtask_binary};
use ckpt_e2e::image::{BUSYBOX_IMAGE, agent_image, build_static_agent};
use ckpt_e2e::progress::human_duration;
use ckpt_e2e::wait::{Probe, holds_for, wait_for, waiting_on_error};
use ckpt_render::DEFAULT_IMAGE;
use serde_json::{Value, json};

use crate::real_node::NodeRun;

/// Where `deploy` installs the agent by default, and where the workload lives (the agent's
/// default `--namespaces` is its own).
pub(crate) const NS: &str = "kube-system";
const AGENT: &str = "pod-checkpointer";
/// The agent's pods as render labels them.
pub(crate) const AGENT_SELECTOR: &str = "app.kubernetes.io/name=pod-checkpointer";
const WORKLOAD: &str = "e2e-workload";
/// The image an upgrade moves to: the same binary under a new tag.
const UPGRADE_TAG_SUFFIX: &str = "-e2e-upgrade";
/// Short enough to watch, long enough to tell apart from an immediate removal.
const GRACE_PERIOD: Duration = Duration::from_secs(20);
/// The label `deploy`'s DaemonSet selects control-plane nodes by (kubeadm sets it).
const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";
/// A nodeSelector no node matches: the DaemonSet no longer targets node-1.
const DESELECTING_PATCH: &str =
    r#"{"spec":{"template":{"spec":{"nodeSelector":{"pod-checkpointer.e2e/target":"nowhere"}}}}}"#;
/// What the workload's containers print each 2 s once they read their files.
const SECRET_VALUE: &str = "hunter2";
const CONFIG_VALUE: &str = "hello";
/// `deploy --prometheus`'s default metrics port on the node's address.
const METRICS_PORT: u16 = 10267;
/// The CRDs of `ckpt_e2e::harness::objects::prometheus_operator_crds`.
const MONITORING_CRDS: [&str; 2] = [
    "podmonitors.monitoring.coreos.com",
    "prometheusrules.monitoring.coreos.com",
];
/// Pods are started by real components, some after a power cut: generous bounds.
const TIMEOUT: Duration = Duration::from_secs(120);

/// The agent's image archives for the node: the rendered manifests' image, and the same
/// binary under the upgrade's tag. The static release build is cached in the target dir.
pub(crate) fn agent_images(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let binary = build_static_agent()?;
    fs::create_dir_all(dir)?;
    let mut archives = Vec::new();
    for (file, reference) in [
        ("agent.oci.tar", DEFAULT_IMAGE.to_owned()),
        ("agent-upgrade.oci.tar", upgrade_image()),
    ] {
        let archive = dir.join(file);
        agent_image(&binary, &reference, &archive)?;
        archives.push(archive);
    }
    Ok(archives)
}

pub(crate) fn upgrade_image() -> String {
    format!("{DEFAULT_IMAGE}{UPGRADE_TAG_SUFFIX}")
}

/// Seeds A, B and C on the real node, and the settings from the deployed ConfigMap.
pub(crate) fn seed(run: &mut NodeRun) -> anyhow::Result<()> {
    let progress = run.progress;
    reset(run)?;
    progress
        .say("seed A: the workload (a Secret, a ConfigMap, root and uid 65534), then `cargo xtask deploy`");
    label_control_plane(run)?;
    run.kubectl.apply(&workload_objects())?;
    let workload = wait_workload(run, "the workload's pod Running", |_| true)?;
    install_monitoring_crds(run)?;
    deploy(run, "grace-period", &["--prometheus"])?;
    let (c1, c2) = wait_installed(run, &workload)?;
    check_config_from_configmap(run, "grace-period")?;
    // Read now: in the power cut below there is no API server to read it from.
    let rules = run
        .kubectl
        .get("prometheusrule", NS, AGENT)?
        .context("deploy --prometheus applied no PrometheusRule")?["spec"]
        .clone();
    check_node_alerts(run, &rules, &[])?;
    progress.say("the deployed alerts, on C1's metrics held as scraped: none fires");

    progress.say("seed B: power cut with the API server down; only static pods start");
    let cut = power_cut_without_api(run, &c1, &workload)?;
    progress.say(&format!(
        "the workload's checkpoint runs and reads its Secret and ConfigMap {} after the cut",
        human_duration(cut.elapsed())
    ));
    let firing = ["PodCheckpointerCheckpointActive", "PodCheckpointerApiNotSynced"];
    check_node_alerts(run, &rules, &firing)?;
    progress.say(&format!(
        "the deployed alerts, on C2's metrics held as scraped: {} fire, no other",
        firing.join(" and ")
    ));

    progress.say("seed C: the API server is back; the parents run again, C1 waits on the lock");
    run.plane.restart_apiserver()?;
    let api_back = Instant::now();
    wait_workload(run, "the workload's parent running again", |pod| {
        pod_running(pod) && restart_count(pod) >= 1
    })?;
    wait_for("the workload's checkpoint to be retired", TIMEOUT, || {
        waiting_on_error((|| {
            let report = inspect_node(run)?;
            Ok(match state_of(&report, &workload) {
                Some("inactive") => Probe::Ready(()),
                state => Probe::Waiting(format!("its state: {state:?}")),
            })
        })())
    })?;
    progress.say(&format!(
        "parent running and checkpoint retired {} after the API server was back",
        human_duration(api_back.elapsed())
    ));
    wait_agent_pair(run, "C1 running again beside C2")?;
    wait_health(run, &c1, "standby")?;
    wait_health(run, &c2, "ok")?;
    anyhow::ensure!(
        count_in_logs(run, &c1, "waiting for the lock") >= 2,
        "C1 did not wait on the lock after the power cut"
    );

    progress
        .say("seed C: the DaemonSet no longer targets the node; C2 removes every checkpoint, then itself");
    self_gc_and_clean_up(run, &[&workload, &c1])?;
    remove_monitoring_crds(run)
}

/// A power cut with the API server down: kills it, reboots the node, and waits until C2
/// (the static copy of `c1`) has taken the lock and `workload`'s checkpoint runs, reads its
/// Secret and ConfigMap as root and as 65534, and is active; when the cut was.
pub(crate) fn power_cut_without_api(run: &mut NodeRun, c1: &str, workload: &str) -> anyhow::Result<Instant> {
    let progress = run.progress;
    run.plane.kill_apiserver()?;
    let cut = Instant::now();
    run.node.reboot()?;
    let c2_mirror = format!("{c1}-{NODE_NAME}");
    wait_for("C2 to take the lock after the power cut", TIMEOUT, || {
        let taken = count_in_logs(run, &c2_mirror, "lock taken: this copy is active");
        Ok(if taken >= 1 {
            Probe::Ready(())
        } else {
            Probe::Waiting(format!("C2's logs: {}", last_log_line(run, &c2_mirror)))
        })
    })?;
    progress.say(&format!(
        "C2 holds the lock {} after the cut",
        human_duration(cut.elapsed())
    ));
    let workload_static = format!("{workload}-{NODE_NAME}");
    wait_for(
        "the workload's checkpoint to run and read its files, as root and as 65534",
        TIMEOUT,
        || {
            let read = ["0", "65534"].map(|uid| count_in_logs(run, &workload_static, &reads_files(uid)));
            Ok(if read.iter().all(|n| *n >= 1) {
                Probe::Ready(())
            } else {
                Probe::Waiting(format!(
                    "lines read by uid 0 and 65534: {read:?}; last: {}",
                    last_log_line(run, &workload_static)
                ))
            })
        },
    )?;
    anyhow::ensure!(
        state_of(&inspect_node(run)?, workload) == Some("active"),
        "the workload's checkpoint runs but is not active"
    );
    Ok(cut)
}

/// The agent's upgrade to a new image tag under `strategy`, then the strategy at work.
/// The agent deployed under `strategy`, then upgraded (`deploy --image`); with `prometheus`,
/// deployed and upgraded with `--prometheus`, whose metrics port on the host network is a
/// host port: render then rolls the DaemonSet without a surge, since a new pod could never
/// schedule beside the old one (kubernetes#106417), and the rollout must still complete.
fn upgrade(run: &mut NodeRun, strategy: &str, prometheus: bool) -> anyhow::Result<()> {
    let progress = run.progress;
    reset(run)?;
    let monitoring: &[&str] = if prometheus { &["--prometheus"] } else { &[] };
    progress.say(&format!(
        "the workload and the agent, deployed with --gc-strategy {strategy} {}",
        monitoring.join(" ")
    ));
    label_control_plane(run)?;
    run.kubectl.apply(&workload_objects())?;
    let workload = wait_workload(run, "the workload's pod Running", |_| true)?;
    if prometheus {
        install_monitoring_crds(run)?;
    }
    deploy(run, strategy, monitoring)?;
    let (c1, c2) = wait_agent_pair(run, "C1 and C2 running")?;
    wait_lock_holder(run, &c1)?;
    wait_inspect(run, "the workload's checkpoint", |i| {
        state_of(i, &workload) == Some("inactive")
    })?;
    check_config_from_configmap(run, strategy)?;

    progress.say(&format!(
        "`cargo xtask deploy --image {}`: the rollout completes, no checkpoint is ever missing",
        upgrade_image()
    ));
    let watch = CheckpointWatch::start(run, &workload)?;
    let lock_watch = LockWatch::start(lock_file(run)?);
    let image = upgrade_image();
    let mut upgrade_args = vec!["--image", image.as_str()];
    upgrade_args.extend(monitoring);
    deploy(run, strategy, &upgrade_args)?;
    let (new_c1, new_c2) = wait_for("the static copy on the new image", TIMEOUT, || {
        waiting_on_error((|| {
            let (c1, c2) = agent_pods(run, AGENT_SELECTOR)?;
            Ok(match (c1, c2) {
                (Some(c1), Some(c2))
                    if image_of(&c1) == upgrade_image() && image_of(&c2) == upgrade_image() =>
                {
                    if pod_running(&c2) && running_image(&c2) == Some(upgrade_image()) {
                        Probe::Ready((name_of(&c1), name_of(&c2)))
                    } else {
                        Probe::Waiting(format!("C2 {}: status {}", name_of(&c2), c2["status"]))
                    }
                }
                (c1, c2) => Probe::Waiting(format!(
                    "images: C1 {:?}, C2 {:?}",
                    c1.as_ref().map(image_of),
                    c2.as_ref().map(image_of)
                )),
            })
        })())
    })?
    .0;
    anyhow::ensure!(new_c1 != c1, "the DaemonSet kept its old pod {c1}");
    // The old static copy goes in the pass after the new one is seen in the kubelet's
    // manifest directory (never before, so the node always keeps one): with a surge the
    // new copy can run before that pass.
    let followed = Instant::now();
    let own = format!("{NS}_{new_c1}.json");
    wait_for("the static copy to follow the new pod alone", TIMEOUT, || {
        let found = self_manifests(run)?;
        Ok(if found == [own.as_str()] {
            Probe::Ready(())
        } else {
            Probe::Waiting(format!("the agent's manifests: {found:?}"))
        })
    })?;
    progress.say(&format!(
        "the old static copy's manifest removed {} after the new copy ran",
        human_duration(followed.elapsed())
    ));
    // The old static copy holds the lock until the kubelet has stopped it.
    wait_lock_holder_among(run, &[&new_c1, &new_c2])?;
    let watched = watch.stop()?;
    let timeline = lock_watch.stop()?;
    check_lock_handovers(&timeline, [&c1, &c2], [&new_c1, &new_c2], rolls_with_surge(run)?)?;
    progress.say(&format!(
        "C2 {new_c2} runs {}; checkpoints present at all {watched} looks",
        upgrade_image()
    ));
    progress.say(&format!(
        "the lock went {}; the node was without a holder for at most {}",
        timeline.holders().join(" → "),
        human_duration(timeline.longest_gap())
    ));
    check_config_from_configmap(run, strategy)?;

    progress.say(&format!(
        "{strategy} removes the workload's checkpoint once its parent is gone"
    ));
    run.kubectl
        .run(&["delete", "daemonset", WORKLOAD, "-n", NS, "--wait=true"], None)?;
    wait_no_pods(run, &workload_selector(), "the workload's pod gone")?;
    let gone = Instant::now();
    if strategy == "grace-period" {
        holds_for(
            "the checkpoint kept during the grace period",
            GRACE_PERIOD / 2,
            || {
                Ok(match state_of(&inspect_node(run)?, &workload) {
                    Some(_) => Probe::Ready(()),
                    None => Probe::Waiting("removed".into()),
                })
            },
        )?;
    }
    let ((), _) = wait_for("the workload's checkpoint to be removed", TIMEOUT, || {
        Ok(match state_of(&inspect_node(run)?, &workload) {
            None => Probe::Ready(()),
            Some(state) => Probe::Waiting(format!("still {state}")),
        })
    })?;
    let mut logs = AgentLogs::default();
    logs.collect(run);
    let removed = logs
        .removal_of(&workload)
        .context("no agent logged the workload's removal")?;
    anyhow::ensure!(
        removed.contains(&format!("strategy={strategy}")),
        "the removal was not by {strategy}: {removed}"
    );
    progress.say(&format!(
        "removed by {strategy} {} after its parent was gone",
        human_duration(gone.elapsed())
    ));
    self_gc_and_clean_up(run, &[&new_c1])?;
    if prometheus {
        remove_monitoring_crds(run)?;
    }
    Ok(())
}

/// The one CI runs: with `--prometheus` (no surge).
pub(crate) fn upgrade_under_grace_period(run: &mut NodeRun) -> anyhow::Result<()> {
    upgrade(run, "grace-period", true)
}

/// With render's default rollout (a surge from 1.25).
pub(crate) fn upgrade_under_immediate(run: &mut NodeRun) -> anyhow::Result<()> {
    upgrade(run, "immediate", false)
}

pub(crate) fn upgrade_under_owner_reference(run: &mut NodeRun) -> anyhow::Result<()> {
    upgrade(run, "owner-reference", false)
}

/// Deselects the node, waits for [`self_gc_after`], then deletes what the scenario and
/// `deploy` created.
fn self_gc_and_clean_up(run: &mut NodeRun, expected_removed: &[&str]) -> anyhow::Result<()> {
    self_gc_after(
        run,
        AGENT_SELECTOR,
        &[
            "patch",
            "daemonset",
            AGENT,
            "-n",
            NS,
            "--type",
            "merge",
            "-p",
            DESELECTING_PATCH,
        ],
        expected_removed,
    )?;
    delete_objects(run)
}

/// Runs `kubectl untarget…` (which stops the DaemonSet from targeting the node), waits for
/// the agent's pods (`selector`) to go and the static copy to remove every checkpoint (the
/// pods of `expected_removed` in that order, the agent's own last), and checks that no file
/// of the agent's is left on the node.
pub(crate) fn self_gc_after(
    run: &mut NodeRun,
    selector: &str,
    untarget: &[&str],
    expected_removed: &[&str],
) -> anyhow::Result<()> {
    // Opened before the change: the static copy's log must outlive its pod.
    let mut logs = AgentLogs::default();
    logs.collect(run);
    run.kubectl.run(untarget, None)?;
    let deselected = Instant::now();
    wait_for("every agent pod to be gone", TIMEOUT, || {
        logs.collect(run);
        waiting_on_error((|| {
            let pods = pods(run, selector)?;
            Ok(if pods.is_empty() {
                Probe::Ready(())
            } else {
                Probe::Waiting(format!(
                    "pods {:?}",
                    pods.iter().map(pod_summary).collect::<Vec<_>>()
                ))
            })
        })())
    })
    .with_context(|| format!("the agents' logs:{}", logs.tails(25)))?;
    wait_for("no checkpoint on the node", TIMEOUT, || {
        logs.collect(run);
        let report = inspect_node(run)?;
        Ok(if report.checkpoints.is_empty() {
            Probe::Ready(())
        } else {
            Probe::Waiting(report.summary())
        })
    })?;
    let removals: Vec<(&str, Option<String>)> = expected_removed
        .iter()
        .map(|pod| (*pod, logs.removal_of(pod)))
        .collect();
    let times: Vec<&str> = removals
        .iter()
        .filter_map(|(_, line)| line.as_deref()?.split_whitespace().next())
        .collect();
    anyhow::ensure!(
        times.len() == removals.len() && times.windows(2).all(|w| w[0] <= w[1]),
        "expected \"checkpoint removed\" for {expected_removed:?} in that order (self last): {removals:?}"
    );
    wait_for("nothing of the agent's left on the node", TIMEOUT, || {
        let left = ours_on_node(run)?;
        Ok(if left.is_empty() {
            Probe::Ready(())
        } else {
            Probe::Waiting(format!("left: {left:?}"))
        })
    })?;
    run.progress.say(&format!(
        "self-GC done {} after the DaemonSet stopped targeting the node; nothing of ours is left",
        human_duration(deselected.elapsed())
    ));
    Ok(())
}

/// The files on the node's `/etc/kubernetes` (the node has none of its own there): all
/// would be the agent's. Its empty dirs may stay: in the pod each is a mount point the
/// agent cannot remove (docs/operations.md, "Uninstalling", says so).
pub(crate) fn ours_on_node(run: &NodeRun) -> anyhow::Result<Vec<String>> {
    Ok(files_under(&host(run, "/etc/kubernetes")?))
}

/// Puts the node back as a scenario expects it, after one that failed half-way: no agent
/// or workload objects, pods, checkpoints or static pods.
pub(crate) fn reset(run: &NodeRun) -> anyhow::Result<()> {
    let leftovers = ours_on_node(run)?;
    let objects = run.kubectl.run(
        &[
            "get",
            "daemonset",
            "-n",
            NS,
            "-o",
            "name",
            "-l",
            "pod-checkpointer.e2e/owned=true",
        ],
        None,
    )? + &run.kubectl.run(
        &[
            "get",
            "daemonset",
            "-n",
            NS,
            "-o",
            "name",
            "--ignore-not-found",
            AGENT,
        ],
        None,
    )?;
    if leftovers.is_empty() && objects.trim().is_empty() {
        return Ok(());
    }
    run.progress.say(&format!(
        "reset after a failed scenario: {} file(s) {:?}, objects {:?}",
        leftovers.len(),
        leftovers.iter().take(5).collect::<Vec<_>>(),
        objects.split_whitespace().collect::<Vec<_>>()
    ));
    delete_objects(run)?;
    for entry in fs::read_dir(host(run, "/etc/kubernetes")?)? {
        let path = entry?.path();
        if path.file_name().is_some_and(|n| n == "manifests") {
            for manifest in fs::read_dir(&path)? {
                fs::remove_file(manifest?.path())?;
            }
        } else if path.is_dir() {
            fs::remove_dir_all(&path)?;
        } else {
            fs::remove_file(&path)?;
        }
    }
    wait_no_pods(run, AGENT_SELECTOR, "no agent pod left")
}

/// Deletes the workload's objects and the agent's DaemonSet (`deploy` re-applies the rest),
/// then waits for the workload's pods to go.
pub(crate) fn delete_objects(run: &NodeRun) -> anyhow::Result<()> {
    run.kubectl.run(
        &[
            "delete",
            "daemonset,secret,configmap",
            "-n",
            NS,
            "-l",
            "pod-checkpointer.e2e/owned=true",
            "--wait=true",
        ],
        None,
    )?;
    run.kubectl.run(
        &[
            "delete",
            "daemonset",
            AGENT,
            "-n",
            NS,
            "--ignore-not-found",
            "--wait=true",
        ],
        None,
    )?;
    wait_no_pods(run, &workload_selector(), "the workload's pods gone")
}

/// Runs `cargo xtask deploy` (the built xtask binary) with what an operator of this node
/// would choose: its kubeconfig, the node-local API endpoint, the strategy, a short grace
/// period; `extra` after those.
fn deploy(run: &NodeRun, strategy: &str, extra: &[&str]) -> anyhow::Result<()> {
    let api_server = run.plane.apiserver_url();
    let mut all = vec!["--api-server", &api_server];
    all.extend(extra);
    deploy_with(run, &run.plane.kubeconfig(), strategy, &all)
}

/// [`deploy`] with another admin kubeconfig (another API server) and no `--api-server`
/// unless `extra` has one: the agent then uses the node-local API server, as on a
/// self-hosted control plane.
pub(crate) fn deploy_with(
    run: &NodeRun,
    kubeconfig: &Path,
    strategy: &str,
    extra: &[&str],
) -> anyhow::Result<()> {
    let grace = format!("{}s", GRACE_PERIOD.as_secs());
    let mut command = Command::new(xtask_binary()?);
    command
        .arg("deploy")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--gc-strategy", strategy, "--grace-period", &grace])
        .args(["--timeout", "3m"])
        .args(extra);
    eprintln!(
        "$ cargo xtask deploy … --gc-strategy {strategy} {}",
        extra.join(" ")
    );
    let started = Instant::now();
    let status = command.status().context("cannot run xtask deploy")?;
    anyhow::ensure!(status.success(), "cargo xtask deploy failed: {status}");
    run.progress.say(&format!(
        "deploy returned (rollout complete) in {}",
        human_duration(started.elapsed())
    ));
    Ok(())
}

/// Checks that the agent runs with the settings of its rendered ConfigMap: the DaemonSet
/// passes only `--config` and `--kubeconfig`, the ConfigMap names `strategy`.
fn check_config_from_configmap(run: &NodeRun, strategy: &str) -> anyhow::Result<()> {
    let daemonset = run
        .kubectl
        .get("daemonset", NS, AGENT)?
        .context("no agent DaemonSet")?;
    let args = daemonset["spec"]["template"]["spec"]["containers"][0]["args"].clone();
    let args: Vec<String> = serde_json::from_value(args).context("the DaemonSet's args")?;
    // `--prometheus` adds the node-IP listener, which needs the downward API.
    let metrics_listen = format!("--metrics-listen=$(HOST_IP):{METRICS_PORT}");
    anyhow::ensure!(
        args.iter()
            .filter(|a| a.starts_with("--"))
            .all(|a| a == "--config" || a == "--kubeconfig" || *a == metrics_listen),
        "the DaemonSet passes settings outside its ConfigMap: {args:?}"
    );
    let configmap = run
        .kubectl
        .get("configmap", NS, AGENT)?
        .context("no agent ConfigMap")?;
    let config = configmap["data"]["config.yaml"].as_str().unwrap_or_default();
    anyhow::ensure!(
        config.contains(&format!("gc-strategy: \"{strategy}\"\n")),
        "the ConfigMap does not name {strategy}: {config}"
    );
    Ok(())
}

/// The Prometheus operator's CRDs, as a cluster that runs it has them: `deploy
/// --prometheus` refuses to apply its PodMonitor and PrometheusRule without them.
fn install_monitoring_crds(run: &NodeRun) -> anyhow::Result<()> {
    run.kubectl.apply(&prometheus_operator_crds())?;
    for crd in MONITORING_CRDS {
        run.kubectl.run(
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                &format!("crd/{crd}"),
            ],
            None,
        )?;
    }
    Ok(())
}

/// Deletes the CRDs, and with them the PodMonitor and PrometheusRule.
fn remove_monitoring_crds(run: &NodeRun) -> anyhow::Result<()> {
    let names: Vec<String> = MONITORING_CRDS.iter().map(|c| format!("crd/{c}")).collect();
    let mut args = vec!["delete", "--ignore-not-found", "--wait=true"];
    args.extend(names.iter().map(String::as_str));
    run.kubectl.run(&args, None)?;
    Ok(())
}

/// Scrapes the active copy's metrics on the node's address (where only the lock holder
/// listens, as Prometheus would find it through the PodMonitor) and checks, with
/// Prometheus' rule engine, that of `rules` (the spec of the PrometheusRule `deploy`
/// applied) exactly `firing` fire if the node stayed as scraped
/// (`ckpt_e2e::promtool::check_alerts`).
fn check_node_alerts(run: &NodeRun, rules: &Value, firing: &[&str]) -> anyhow::Result<()> {
    let address = std::net::SocketAddr::from((run.node.ip(), METRICS_PORT));
    let (exposition, scraped_at) = wait_for(
        &format!("the active copy's metrics on {address}"),
        TIMEOUT,
        || waiting_on_error(scrape(address).map(|text| Probe::Ready((text, std::time::SystemTime::now())))),
    )?
    .0;
    let job = format!("{NS}/{AGENT}");
    ckpt_e2e::promtool::check_alerts(
        rules,
        &exposition,
        scraped_at,
        &[("job", &job), ("node", NODE_NAME)],
        firing,
    )
    .with_context(|| format!("scraped from {address}:\n{exposition}"))
}

/// `GET /metrics` over plain HTTP/1.0: the body of a 200 answer.
fn scrape(address: std::net::SocketAddr) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&address, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n")?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .context("an answer without a header end")?;
    anyhow::ensure!(
        head.lines().next().is_some_and(|l| l.contains(" 200 ")),
        "the answer is not a 200: {head}"
    );
    Ok(body.to_owned())
}

/// The label `deploy`'s DaemonSet needs, as the cluster's installer would set it.
pub(crate) fn label_control_plane(run: &NodeRun) -> anyhow::Result<()> {
    run.kubectl.run(
        &[
            "label",
            "node",
            NODE_NAME,
            &format!("{CONTROL_PLANE_LABEL}="),
            "--overwrite",
        ],
        None,
    )?;
    Ok(())
}

/// The line each workload container prints once it has read its files as `uid`.
fn reads_files(uid: &str) -> String {
    format!("uid={uid} secret={SECRET_VALUE} config={CONFIG_VALUE} absent-optional=0")
}

/// A Secret, a ConfigMap and an annotated DaemonSet (hostNetwork, like a control-plane
/// pod) whose two containers, one root and one uid 65534 (fsGroup 65534), print what they
/// read from both, and how many files an optional ConfigMap that does not exist gives them
/// (none: its checkpointed directory exists, empty, as the `type: Directory` mount needs).
pub(crate) fn workload_objects() -> Vec<Value> {
    let labels = json!({ "pod-checkpointer.e2e/owned": "true" });
    let script = r#"while true; do echo "uid=$(id -u) secret=$(cat /secret/password) config=$(cat /config/greeting) absent-optional=$(ls /absent | wc -l)"; sleep 2; done"#;
    let container = |name: &str, user: u32| {
        json!({
            "name": name,
            "image": BUSYBOX_IMAGE,
            "imagePullPolicy": "Never",
            "command": ["/bin/sh", "-c", script],
            "securityContext": { "runAsUser": user },
            "volumeMounts": [
                { "name": "secret", "mountPath": "/secret", "readOnly": true },
                { "name": "config", "mountPath": "/config", "readOnly": true },
                { "name": "absent", "mountPath": "/absent", "readOnly": true }
            ]
        })
    };
    vec![
        json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": { "name": WORKLOAD, "namespace": NS, "labels": labels },
            "stringData": { "password": SECRET_VALUE }
        }),
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": { "name": WORKLOAD, "namespace": NS, "labels": labels },
            "data": { "greeting": CONFIG_VALUE }
        }),
        json!({
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": { "name": WORKLOAD, "namespace": NS, "labels": labels },
            "spec": {
                "selector": { "matchLabels": { "app": WORKLOAD } },
                "template": {
                    "metadata": {
                        "labels": { "app": WORKLOAD },
                        "annotations": { "checkpointer.alpha.coreos.com/checkpoint": "true" }
                    },
                    "spec": {
                        "hostNetwork": true,
                        "terminationGracePeriodSeconds": 2,
                        "securityContext": { "fsGroup": 65534 },
                        "tolerations": [{ "operator": "Exists" }],
                        "containers": [container("root", 0), container("nobody", 65534)],
                        "volumes": [
                            { "name": "secret", "secret": { "secretName": WORKLOAD } },
                            { "name": "config", "configMap": { "name": WORKLOAD } },
                            {
                                "name": "absent",
                                "configMap": { "name": "e2e-never-created", "optional": true }
                            }
                        ]
                    }
                }
            }
        }),
    ]
}

fn pods(run: &NodeRun, selector: &str) -> anyhow::Result<Vec<Value>> {
    run.kubectl.pods(NS, selector)
}

fn workload_selector() -> String {
    format!("app={WORKLOAD}")
}

fn workload_pods(run: &NodeRun) -> anyhow::Result<Vec<Value>> {
    pods(run, &workload_selector())
}

/// Waits until no pod in the agent's namespace matches `selector`.
fn wait_no_pods(run: &NodeRun, selector: &str, expected: &str) -> anyhow::Result<()> {
    wait_for(expected, TIMEOUT, || {
        waiting_on_error((|| {
            Ok(match pods(run, selector)?.len() {
                0 => Probe::Ready(()),
                n => Probe::Waiting(format!("{n} pod(s)")),
            })
        })())
    })?;
    Ok(())
}

/// The workload DaemonSet's one pod (not a mirror pod), once `check` holds for it; its name.
pub(crate) fn wait_workload(
    run: &NodeRun,
    expected: &str,
    check: impl Fn(&Value) -> bool,
) -> anyhow::Result<String> {
    let (name, _) = wait_for(expected, TIMEOUT, || {
        waiting_on_error((|| {
            let pods: Vec<Value> = workload_pods(run)?
                .into_iter()
                .filter(|p| !is_mirror(p))
                .collect();
            Ok(match pods.as_slice() {
                [pod] if pod_running(pod) && check(pod) => Probe::Ready(name_of(pod)),
                [pod] => Probe::Waiting(format!("status {}", pod["status"])),
                pods => Probe::Waiting(format!("{} pods", pods.len())),
            })
        })())
    })?;
    Ok(name)
}

/// The agent's DaemonSet pod (C1) and the mirror pod of its static copy (C2), if any,
/// among the pods `selector` selects.
fn agent_pods(run: &NodeRun, selector: &str) -> anyhow::Result<(Option<Value>, Option<Value>)> {
    let pods = pods(run, selector)?;
    let c1 = pods
        .iter()
        .find(|p| !is_mirror(p) && p["metadata"]["deletionTimestamp"].is_null());
    let c2 = pods.iter().find(|p| is_mirror(p));
    Ok((c1.cloned(), c2.cloned()))
}

/// The agent just installed, settled: C1 and its static copy C2 run, C1 holds the lock and
/// answers ready, C2 stands by, and `workload`'s checkpoint (inactive) and C1's (active)
/// are on the node; their names.
pub(crate) fn wait_installed(run: &NodeRun, workload: &str) -> anyhow::Result<(String, String)> {
    let (c1, c2) = wait_agent_pair(run, "C1 and the static copy C2 running")?;
    wait_lock_holder(run, &c1)?;
    run.progress.say(&format!(
        "C1 {c1} and its static copy C2 {c2} run; C1 holds the lock"
    ));
    wait_health(run, &c1, "ok")?;
    wait_health(run, &c2, "standby")?;
    let checkpoints = wait_inspect(run, "the workload's and the agent's checkpoints", |i| {
        state_of(i, workload) == Some("inactive") && state_of(i, &c1).is_some_and(|s| s.starts_with("active"))
    })?;
    run.progress
        .say(&format!("checkpoints: {}", checkpoints.summary()));
    Ok((c1, c2))
}

/// C1 and C2 both running, C2 the static copy of C1; their names.
pub(crate) fn wait_agent_pair(run: &NodeRun, expected: &str) -> anyhow::Result<(String, String)> {
    wait_agent_pair_among(run, AGENT_SELECTOR, expected)
}

/// [`wait_agent_pair`] among the pods `selector` selects.
pub(crate) fn wait_agent_pair_among(
    run: &NodeRun,
    selector: &str,
    expected: &str,
) -> anyhow::Result<(String, String)> {
    let (pair, _) = wait_for(expected, TIMEOUT, || {
        waiting_on_error((|| {
            Ok(match agent_pods(run, selector)? {
                (Some(c1), Some(c2))
                    if pod_running(&c1)
                        && pod_running(&c2)
                        && name_of(&c2) == format!("{}-{NODE_NAME}", name_of(&c1)) =>
                {
                    Probe::Ready((name_of(&c1), name_of(&c2)))
                }
                (c1, c2) => Probe::Waiting(format!(
                    "C1 {:?}, C2 {:?}",
                    c1.map(|p| (name_of(&p), p["status"]["phase"].clone())),
                    c2.map(|p| (name_of(&p), p["status"]["phase"].clone()))
                )),
            })
        })())
    })?;
    Ok(pair)
}

/// Waits until `pod`'s readiness probe command (`pod-checkpointer health --ready`, run in
/// its container through the API) answers `expected` (`ok` for the holder, `standby`).
pub(crate) fn wait_health(run: &NodeRun, pod: &str, expected: &str) -> anyhow::Result<()> {
    let (_, _) = wait_for(
        &format!("{pod}'s readiness to answer {expected}"),
        TIMEOUT,
        || {
            waiting_on_error((|| {
                let answer = run.kubectl.run(
                    &[
                        "exec",
                        "-n",
                        NS,
                        pod,
                        "--",
                        "/pod-checkpointer",
                        "health",
                        "--ready",
                        "--config",
                        "/etc/pod-checkpointer/config.yaml",
                    ],
                    None,
                )?;
                Ok(if answer.trim() == expected {
                    Probe::Ready(())
                } else {
                    Probe::Waiting(format!("it answers {:?}", answer.trim()))
                })
            })())
        },
    )?;
    Ok(())
}

/// Whether a pod's `Ready` condition is `True`.
pub(crate) fn is_ready(pod: &Value) -> bool {
    (pod["status"]["conditions"].as_array().into_iter().flatten())
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

pub(crate) fn is_mirror(pod: &Value) -> bool {
    pod["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_string()
}

/// A pod's name, phase, and deletion time if it is terminating: what a timeout needs to
/// say why a pod is still listed.
fn pod_summary(pod: &Value) -> String {
    let phase = pod["status"]["phase"].as_str().unwrap_or("no phase");
    match pod["metadata"]["deletionTimestamp"].as_str() {
        Some(at) => format!("{} ({phase}, terminating since {at})", name_of(pod)),
        None => format!("{} ({phase})", name_of(pod)),
    }
}

pub(crate) fn name_of(object: &Value) -> String {
    object["metadata"]["name"].as_str().unwrap_or_default().to_owned()
}

fn image_of(pod: &Value) -> String {
    pod["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The image the pod's running container was started from, as the kubelet reports it.
fn running_image(pod: &Value) -> Option<String> {
    let status = &pod["status"]["containerStatuses"][0];
    status["state"]["running"]
        .is_object()
        .then(|| status["image"].as_str().unwrap_or_default().to_owned())
}

/// A pod's highest container restart count, from its API status.
pub(crate) fn restart_count(pod: &Value) -> u64 {
    pod["status"]["containerStatuses"].as_array().map_or(0, |s| {
        s.iter()
            .filter_map(|c| c["restartCount"].as_u64())
            .max()
            .unwrap_or(0)
    })
}

/// A node path on the host.
pub(crate) fn host(run: &NodeRun, node_path: &str) -> anyhow::Result<PathBuf> {
    run.node
        .host_path(node_path)
        .with_context(|| format!("{node_path} is not one of the node's own dirs"))
}

/// The agent's lock file, seen from the host.
pub(crate) fn lock_file(run: &NodeRun) -> anyhow::Result<PathBuf> {
    host(run, "/run/pod-checkpointer/pod-checkpointer.lock")
}

/// Waits until the process holding the agent's lock says it is `pod`.
fn wait_lock_holder(run: &NodeRun, pod: &str) -> anyhow::Result<()> {
    wait_lock_holder_among(run, &[pod])
}

/// Waits until one of `pods` holds the node's lock.
fn wait_lock_holder_among(run: &NodeRun, pods: &[&str]) -> anyhow::Result<()> {
    wait_lock_holder_in(&lock_file(run)?, pods)
}

/// Waits until one of `pods` holds `lock_file` (on the host).
pub(crate) fn wait_lock_holder_in(lock_file: &Path, pods: &[&str]) -> anyhow::Result<()> {
    wait_for(
        &format!("{} to hold the lock", pods.join(" or ")),
        TIMEOUT,
        || {
            Ok(match lock_holder(lock_file)? {
                Some(Holding {
                    pod: Some(holder), ..
                }) if pods.contains(&holder.as_str()) => Probe::Ready(()),
                other => Probe::Waiting(format!("held by {other:?}")),
            })
        },
    )?;
    Ok(())
}

/// The longest the node may be without a lock holder during a rollout: a handover is the
/// holder's exit plus one poll of the waiting copy (250 ms); a longer gap means no copy
/// was waiting, which leaves the node unprotected.
const LONGEST_HANDOVER: Duration = Duration::from_secs(5);

/// During a rollout of the agent from `old` (C1, C2) to `new`, the lock goes from the old
/// DaemonSet pod to its static copy, which holds it while the DaemonSet pod is replaced,
/// and on to a copy of the new pod, with no other holder and no long gap. With a surge
/// (`maxSurge`, render's default from 1.25) the new pod is already waiting for the lock
/// when the old one exits, so it may take it before the old static copy does: the static
/// copy's turn is then optional.
fn check_lock_handovers(
    timeline: &LockTimeline,
    [old_c1, old_c2]: [&str; 2],
    [new_c1, new_c2]: [&str; 2],
    surge: bool,
) -> anyhow::Result<()> {
    let holders = timeline.holders();
    let known = [old_c1, old_c2, new_c1, new_c2];
    let via_static_copy = holders.len() >= 3 && holders[1] == old_c2;
    let new_from = if via_static_copy { 2 } else { 1 };
    anyhow::ensure!(
        holders.len() > new_from
            && holders[0] == old_c1
            && (via_static_copy || surge)
            && holders[new_from..].iter().all(|h| h == new_c1 || h == new_c2)
            && holders.iter().all(|h| known.contains(&h.as_str())),
        "the lock should go {old_c1} → its static copy {old_c2}{} → the new pod's copies; it went: {}",
        if surge { " (optional with a surge)" } else { "" },
        timeline.describe()
    );
    anyhow::ensure!(
        timeline.longest_gap() < LONGEST_HANDOVER,
        "the node was without a lock holder for {}: {}",
        human_duration(timeline.longest_gap()),
        timeline.describe()
    );
    Ok(())
}

/// Whether the agent's DaemonSet rolls out with a surge (`maxSurge` above 0): the new pod
/// starts beside the old one.
fn rolls_with_surge(run: &NodeRun) -> anyhow::Result<bool> {
    let daemon_set = run
        .kubectl
        .get("daemonset", NS, AGENT)?
        .context("no DaemonSet of the agent")?;
    let surge = &daemon_set["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"];
    Ok(match surge {
        Value::Number(n) => n.as_u64().is_some_and(|n| n > 0),
        Value::String(s) => !matches!(s.as_str(), "0" | "0%"),
        _ => false,
    })
}

/// `pod-checkpointer inspect` on the node's dirs (the agent's defaults, seen from the host).
pub(crate) fn inspect_node(run: &NodeRun) -> anyhow::Result<Inspect> {
    let dirs = AgentDirs {
        checkpoint_dir: host(run, "/etc/kubernetes")?,
        manifests_dir: host(run, "/etc/kubernetes/manifests")?,
        lock_file: lock_file(run)?,
    };
    inspect(&agent_binary()?, &dirs)
}

pub(crate) fn wait_inspect(
    run: &NodeRun,
    expected: &str,
    check: impl Fn(&Inspect) -> bool,
) -> anyhow::Result<Inspect> {
    let (report, _) = wait_for(expected, TIMEOUT, || {
        let report = inspect_node(run)?;
        Ok(if check(&report) {
            Probe::Ready(report)
        } else {
            Probe::Waiting(report.summary())
        })
    })?;
    Ok(report)
}

/// The state of `pod`'s checkpoint (in the agent's namespace), if it has one.
pub(crate) fn state_of<'i>(report: &'i Inspect, pod: &str) -> Option<&'i str> {
    let id = format!("{NS}/{pod}");
    report
        .checkpoints
        .iter()
        .find(|c| c.pod == id)
        .map(|c| c.state.as_str())
}

/// The self-checkpoints among the active manifests (the agent's own pod, by its name).
fn self_manifests(run: &NodeRun) -> anyhow::Result<Vec<String>> {
    let prefix = format!("{NS}_{AGENT}-");
    let mut names = Vec::new();
    for entry in fs::read_dir(host(run, "/etc/kubernetes/manifests")?)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.starts_with(&prefix) && name.ends_with(".json") {
            names.push(name);
        }
    }
    Ok(names)
}

/// Every container log file the kubelet wrote for pods named `pod` (any UID, any
/// restart), in order.
fn log_files(run: &NodeRun, pod: &str) -> Vec<PathBuf> {
    let Ok(root) = host(run, "/var/log/pods") else {
        return Vec::new();
    };
    let prefix = format!("{NS}_{pod}_");
    let mut files: Vec<PathBuf> = fs::read_dir(&root)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .flat_map(|e| files_under(&e.path()).into_iter().map(PathBuf::from))
        .collect();
    files.sort();
    files
}

/// The messages of [`log_files`], oldest file first within each container.
pub(crate) fn log_lines(run: &NodeRun, pod: &str) -> Vec<String> {
    log_files(run, pod)
        .iter()
        .filter_map(|f| fs::read_to_string(f).ok())
        .flat_map(|text| text.lines().map(cri_log_message).collect::<Vec<_>>())
        .collect()
}

/// `2026-…Z stderr F message` → `message`.
fn cri_log_message(line: &str) -> String {
    line.splitn(4, ' ').nth(3).unwrap_or(line).to_owned()
}

pub(crate) fn count_in_logs(run: &NodeRun, pod: &str, needle: &str) -> usize {
    log_lines(run, pod).iter().filter(|l| l.contains(needle)).count()
}

pub(crate) fn last_log_line(run: &NodeRun, pod: &str) -> String {
    log_lines(run, pod).pop().unwrap_or_else(|| "(no log yet)".into())
}

/// The agent copies' logs (DaemonSet pods and static copies), each file kept open from
/// the first look: the kubelet deletes a static pod's logs soon after the pod goes, self-GC
/// makes the copy that does it go, and it writes its last lines just before; an open file
/// can still be read to its end once unlinked.
#[derive(Default)]
struct AgentLogs(BTreeMap<PathBuf, (Option<fs::File>, String)>);

impl AgentLogs {
    fn collect(&mut self, run: &NodeRun) {
        use std::io::Read;
        for pod in pods_named_like(run, AGENT) {
            for file in log_files(run, &pod) {
                self.0
                    .entry(file.clone())
                    .or_insert_with(|| (fs::File::open(&file).ok(), String::new()));
            }
        }
        for (path, (file, text)) in &mut self.0 {
            // A file that could not be opened at first sight is tried again.
            if file.is_none() {
                *file = fs::File::open(path).ok();
            }
            if let Some(file) = file {
                // The CRI log format is text; a line cut by a partial write is completed
                // by the next read.
                let mut bytes = Vec::new();
                if file.read_to_end(&mut bytes).is_ok() {
                    text.push_str(&String::from_utf8_lossy(&bytes));
                }
            }
        }
    }

    /// The last "checkpoint removed" line for `pod`, with the agent's own timestamp first
    /// (RFC 3339 in UTC, so later lines sort later).
    fn removal_of(&self, pod: &str) -> Option<String> {
        let needle = format!("pod={NS}/{pod} ");
        self.0
            .values()
            .flat_map(|(_, text)| text.lines())
            .map(cri_log_message)
            .filter(|line| line.contains("checkpoint removed") && line.contains(&needle))
            .max()
    }

    /// The last `n` lines of each agent log collected, for a timeout's message.
    fn tails(&self, n: usize) -> String {
        let mut out = String::new();
        for (path, (_, text)) in &self.0 {
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!("\n--- {} (last {n} lines)\n", path.display()));
            for line in &lines[lines.len().saturating_sub(n)..] {
                out.push_str(&cri_log_message(line));
                out.push('\n');
            }
        }
        out
    }
}

/// The pod names under `/var/log/pods` in the agent's namespace that start with `prefix-`.
pub(crate) fn pods_named_like(run: &NodeRun, prefix: &str) -> BTreeSet<String> {
    let Ok(root) = host(run, "/var/log/pods") else {
        return BTreeSet::new();
    };
    let start = format!("{NS}_{prefix}-");
    fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let rest = name.strip_prefix(&format!("{NS}_"))?;
            name.starts_with(&start)
                .then(|| rest.rsplit_once('_').map(|(pod, _uid)| pod.to_owned()))
                .flatten()
        })
        .collect()
}

fn files_under(dir: &Path) -> Vec<String> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            match entry.file_type() {
                Ok(t) if t.is_dir() => pending.push(path),
                _ => files.push(path.display().to_string()),
            }
        }
    }
    files
}

/// Looks every 100 ms, from a thread, that the agent's self-checkpoint is in the manifests
/// dir and the workload's inactive checkpoint is in place; remembers the first miss.
struct CheckpointWatch {
    stop: Arc<AtomicBool>,
    handle: thread::JoinHandle<Result<usize, String>>,
}

impl CheckpointWatch {
    fn start(run: &NodeRun, workload: &str) -> anyhow::Result<CheckpointWatch> {
        let manifests = host(run, "/etc/kubernetes/manifests")?;
        let inactive = host(run, "/etc/kubernetes/inactive-manifests")?.join(format!("{NS}_{workload}.json"));
        let self_prefix = format!("{NS}_{AGENT}-");
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let handle = thread::spawn(move || {
            let started = Instant::now();
            let mut looks = 0;
            while !stopping.load(Ordering::SeqCst) {
                let has_self = fs::read_dir(&manifests).into_iter().flatten().flatten().any(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.starts_with(&self_prefix) && name.ends_with(".json")
                });
                if !has_self {
                    return Err(format!(
                        "no self-checkpoint in the manifests dir {} into the upgrade",
                        human_duration(started.elapsed())
                    ));
                }
                if !inactive.is_file() {
                    return Err(format!(
                        "the workload's checkpoint {} missing {} into the upgrade",
                        inactive.display(),
                        human_duration(started.elapsed())
                    ));
                }
                looks += 1;
                thread::sleep(Duration::from_millis(100));
            }
            Ok(looks)
        });
        Ok(CheckpointWatch { stop, handle })
    }

    /// How many looks found everything in place, or the first miss.
    fn stop(self) -> anyhow::Result<usize> {
        self.stop.store(true, Ordering::SeqCst);
        match self.handle.join() {
            Ok(Ok(looks)) => Ok(looks),
            Ok(Err(miss)) => anyhow::bail!("{miss}"),
            Err(_) => anyhow::bail!("the checkpoint watch panicked"),
        }
    }
}
