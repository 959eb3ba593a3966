//! Three real nodes on one LAN (issue 38): the cluster the group's scenarios share (a plane
//! in the LAN's namespace on an etcd of one member per node, three kubelets with containerd
//! and runc in namespaces of their own), and its smoke scenario: pods on each node that
//! reach each other across nodes, one node's power cut that leaves the other two untouched
//! and whose etcd member rejoins, and a stop that leaves nothing behind. It measures the
//! start, the cut, and what the three nodes and the plane cost in memory. The self-hosted
//! scenarios are in `three_nodes_cut`, `three_nodes_faults` and `three_nodes_upgrades`.
//!
//! The scenarios of this group share the cluster and run after the single real node's (the
//! two use different addresses and namespaces, but running them one after the other keeps
//! the machine's 2 cores to one cluster at a time).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use ckpt_e2e::e2e_env::real_node::BUSYBOX_IMAGE;
use ckpt_e2e::e2e_env::{ControlPlane, NodeFootprint, RealNode, RealNodeOptions, StartOptions};
use ckpt_e2e::harness::kubectl::{Kubectl, pod_running};
use ckpt_e2e::interrupt;
use ckpt_e2e::process::{is_alive, log_tail, rss_kib};
use ckpt_e2e::progress::{Progress, human_duration};
use ckpt_e2e::self_hosted::SelfHosted;
use ckpt_e2e::wait::{Probe, wait_for, waiting_on_error};

use crate::group::{Group, SharedEnv};
use crate::real_node_seed::restart_count;
use serde_json::{Value, json};

/// How many nodes the cluster has.
const NODES: usize = 3;
const NAMESPACE: &str = "three-nodes";
/// The port each node's pod serves its own `/etc` on (busybox httpd).
const POD_PORT: u16 = 8080;
const TIMEOUT: Duration = Duration::from_secs(90);

/// The plane and the three nodes every scenario of the group shares.
pub(crate) struct ClusterRun {
    pub(crate) plane: ControlPlane,
    /// `node-1` first.
    pub(crate) nodes: Vec<RealNode>,
    /// kubectl as admin, run in the LAN's namespace (the machine's has no route to it).
    pub(crate) kubectl: Kubectl,
    pub(crate) progress: Progress,
    /// The self-hosted control plane once a scenario pivoted to it (for good: the plane's
    /// own API server is gone from then on), with the agent deployed.
    pub(crate) self_hosted: Option<SelfHosted>,
}

/// The three-node scenarios' group: one plane and three nodes for all of them.
pub(crate) const GROUP: Group<ClusterRun> = Group {
    on: "3 real nodes",
    start,
    stop,
    stop_check: "three_nodes_stop_leaves_nothing",
};

impl SharedEnv for ClusterRun {
    fn keep_logs(&self, scenario: &str) {
        keep_logs(scenario, self);
    }

    fn report_failure(&self) {
        report_failure(self);
    }
}

fn start(progress: Progress) -> anyhow::Result<ClusterRun> {
    let bins = ckpt_e2e::e2e_env::cached_bins(ckpt_e2e::e2e_env::Release::from_env()?)?;
    let mut options = RealNodeOptions::new(bins.clone());
    let (plane, mut nodes) = ControlPlane::start_on_lan(&StartOptions::real_nodes(bins, NODES)?, |plane| {
        progress.say("the agent's images (the static release build), then the nodes");
        options.images = crate::real_node_seed::agent_images(&plane.workdir().join("images"))?;
        (1..=NODES)
            .map(|index| RealNode::boot_on_lan(plane, &options, index))
            .collect::<anyhow::Result<Vec<_>>>()
    })?;
    for node in &mut nodes {
        let took = node.wait_ready(&plane, options.ready_timeout)?;
        progress.say(&format!("{} Ready after {}", node.name(), human_duration(took)));
    }
    let kubectl =
        Kubectl::new(&plane.kubeconfig(), &plane.workdir().join("kubectl-cache")).in_netns(plane.netns());
    Ok(ClusterRun {
        plane,
        nodes,
        kubectl,
        progress,
        self_hosted: None,
    })
}

/// Stops the nodes and the plane; what they made on the machine (taken before the stop) must
/// all be gone afterwards, the LAN included.
fn stop(run: ClusterRun) -> anyhow::Result<()> {
    let ClusterRun {
        plane,
        nodes,
        progress,
        ..
    } = run;
    let workdir = plane.workdir().to_owned();
    let lan = plane.lan().cloned().context("the plane has no LAN")?;
    let footprints: Vec<NodeFootprint> = nodes.iter().map(RealNode::footprint).collect();
    let processes: usize = footprints.iter().map(NodeFootprint::process_count).sum();
    progress.say(&format!(
        "stopping the {NODES} nodes ({processes} processes) and the plane"
    ));
    for node in nodes {
        node.stop()?;
    }
    plane.stop()?;
    let survivors: Vec<String> = footprints.iter().flat_map(NodeFootprint::survivors).collect();
    anyhow::ensure!(
        survivors.is_empty(),
        "the nodes left behind: {}",
        survivors.join("; ")
    );
    anyhow::ensure!(!lan.exists(), "the LAN's namespaces survive the stop");
    anyhow::ensure!(!workdir.exists(), "{} survives the stop", workdir.display());
    progress.say("nothing of the three nodes or their LAN survives the stop");
    Ok(())
}

/// The cluster itself: every node Ready on its LAN address with no default route, nothing
/// of the LAN in the machine's namespace, a pod on each node that the others reach across
/// nodes, and a power cut of node-2 that node-1's and node-3's containers never notice.
pub(crate) fn start_cut_one_and_back(run: &mut ClusterRun) -> anyhow::Result<()> {
    let ClusterRun {
        plane,
        nodes,
        kubectl,
        progress,
        ..
    } = run;
    progress.say("the nodes: Ready on their LAN addresses, no default route");
    for node in nodes.iter() {
        let object = kubectl
            .run(&["get", "node", node.name(), "-o", "json"], None)
            .and_then(|out| Ok(serde_json::from_str::<Value>(&out)?))?;
        let addresses = object["status"]["addresses"].to_string();
        let ip = node.ip().to_string();
        anyhow::ensure!(
            addresses.contains(&format!("\"{ip}\"")),
            "{} has addresses {addresses}, not {ip}",
            node.name()
        );
        let default_routes = node.exec(&["ip", "-4", "route", "show", "default"])?;
        anyhow::ensure!(
            default_routes.trim().is_empty(),
            "{} has a default route: {default_routes}",
            node.name()
        );
    }
    let lan = plane.lan().context("the plane has no LAN")?;
    let machine_links = std::fs::read_dir("/sys/class/net")?
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with("pckpt-lan") || *name == lan.bridge)
        .collect::<Vec<_>>();
    anyhow::ensure!(
        machine_links.is_empty(),
        "the machine's namespace has LAN interfaces: {machine_links:?}"
    );

    progress.say("etcd: a member on each node, all healthy");
    wait_members_healthy(plane, nodes)?;

    progress.say("a pod on each node, serving its /etc; each reached from the next node's pod");
    kubectl.run(&["create", "namespace", NAMESPACE], None)?;
    for node in nodes.iter() {
        kubectl.create(&serving_pod(node.name()))?;
    }
    let mut pods = Vec::new();
    for node in nodes.iter() {
        let pod = wait_pod(kubectl, node.name(), "Running", pod_running)?;
        let ip = pod["status"]["podIP"].as_str().unwrap_or_default().to_owned();
        let cidr = &node.network().pod_cidr;
        let prefix = cidr.to_string();
        let prefix = prefix.trim_end_matches(".0");
        anyhow::ensure!(
            ip.starts_with(&format!("{prefix}.")),
            "{}'s pod has the address {ip:?}, outside {}",
            node.name(),
            node.network().pod_cidr_text()
        );
        pods.push((node.name().to_owned(), ip));
    }
    for (index, (from, _)) in pods.iter().enumerate() {
        let (to, ip) = &pods[(index + 1) % pods.len()];
        let hostname = fetch_hostname(kubectl, from, ip)?;
        anyhow::ensure!(
            hostname == pod_name(to),
            "{from}'s pod asked {to}'s pod at {ip} and got {hostname:?}"
        );
    }

    progress.say("what the cluster costs: resident memory of each part");
    report_memory(plane, nodes, progress);

    let survivors: BTreeMap<String, Vec<u32>> = nodes
        .iter()
        .filter(|node| node.name() != "node-2")
        .map(|node| (node.name().to_owned(), container_pids(node)))
        .collect();
    let before = restarts(kubectl, "node-2")?;
    progress.say("power cut of node-2; node-1 and node-3 run on");
    let node_2 = nodes
        .iter_mut()
        .find(|node| node.name() == "node-2")
        .context("no node-2")?;
    let cut = Instant::now();
    node_2.reboot()?;
    node_2.wait_ready(plane, TIMEOUT)?;
    let pod = wait_pod(kubectl, "node-2", "Running after the cut", |pod| {
        pod_running(pod) && restart_count(pod) > before
    })?;
    progress.say(&format!(
        "node-2's pod Running again {} after the cut (restarts {})",
        human_duration(cut.elapsed()),
        restart_count(&pod)
    ));
    for (name, pids) in &survivors {
        anyhow::ensure!(!pids.is_empty(), "{name} had no container processes");
        let dead: Vec<u32> = pids.iter().copied().filter(|pid| !is_alive(*pid)).collect();
        anyhow::ensure!(
            dead.is_empty(),
            "node-2's power cut killed processes of {name}: {dead:?}"
        );
        anyhow::ensure!(
            restarts(kubectl, name)? == 0,
            "{name}'s pod restarted during node-2's cut"
        );
    }
    wait_members_healthy(plane, nodes)?;
    let (from, to) = (&pods[0].0, "node-2");
    let ip = pod["status"]["podIP"].as_str().unwrap_or_default();
    let hostname = fetch_hostname(kubectl, from, ip)?;
    anyhow::ensure!(
        hostname == pod_name(to),
        "after the cut {from}'s pod asked {to}'s at {ip} and got {hostname:?}"
    );
    kubectl.run(&["delete", "namespace", NAMESPACE, "--wait=true"], None)?;
    Ok(())
}

/// Waits until every node's etcd member answers `/health` with `true`, asked from the LAN.
fn wait_members_healthy(plane: &ControlPlane, nodes: &[RealNode]) -> anyhow::Result<()> {
    for node in nodes {
        let url = format!("http://{}:2379/health", node.ip());
        wait_for(&format!("{}'s etcd member healthy", node.name()), TIMEOUT, || {
            let mut curl = plane.command("curl");
            curl.args(["-s", "--max-time", "5", &url]);
            Ok(match ckpt_e2e::command::run_command(&mut curl) {
                Ok(body) if body.contains(r#""health":"true""#) => Probe::Ready(()),
                Ok(body) => Probe::Waiting(body),
                Err(e) => Probe::Waiting(format!("{e:#}")),
            })
        })?;
    }
    Ok(())
}

fn pod_name(node: &str) -> String {
    format!("serve-{node}")
}

/// A busybox on `node` serving its own `/etc` (its `hostname` is the pod's name).
fn serving_pod(node: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": pod_name(node), "namespace": NAMESPACE },
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "httpd",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                // An applet the shell finds: the image has no httpd link on its PATH.
                "command": ["sh", "-c", format!("exec httpd -f -p {POD_PORT} -h /etc")]
            }]
        }
    })
}

/// `GET /hostname` of the pod at `ip`, asked from the pod on `from` (busybox's wget crashes
/// in this static build, so nc speaks the HTTP).
fn fetch_hostname(kubectl: &Kubectl, from: &str, ip: &str) -> anyhow::Result<String> {
    let request = format!("printf 'GET /hostname HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {ip} {POD_PORT}");
    let (reply, _) = wait_for(&format!("{from}'s pod to reach {ip}"), TIMEOUT, || {
        waiting_on_error((|| {
            let reply = kubectl.run(
                &[
                    "exec",
                    "-n",
                    NAMESPACE,
                    &pod_name(from),
                    "--",
                    "sh",
                    "-c",
                    &request,
                ],
                None,
            )?;
            Ok(match reply.split("\r\n\r\n").nth(1) {
                Some(body) if reply.starts_with("HTTP/1.") => Probe::Ready(body.trim().to_owned()),
                _ => Probe::Waiting(format!("reply {reply:?}")),
            })
        })())
    })?;
    Ok(reply)
}

fn wait_pod(
    kubectl: &Kubectl,
    node: &str,
    expected: &str,
    check: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    let name = pod_name(node);
    let (pod, _) = wait_for(&format!("{name} {expected}"), TIMEOUT, || {
        waiting_on_error((|| {
            Ok(match kubectl.get("pod", NAMESPACE, &name)? {
                Some(pod) if check(&pod) => Probe::Ready(pod),
                Some(pod) => Probe::Waiting(format!("status {}", pod["status"])),
                None => Probe::Waiting("no such pod".into()),
            })
        })())
    })?;
    Ok(pod)
}

fn restarts(kubectl: &Kubectl, node: &str) -> anyhow::Result<u64> {
    let pod = kubectl
        .get("pod", NAMESPACE, &pod_name(node))?
        .with_context(|| format!("no pod {}", pod_name(node)))?;
    Ok(restart_count(&pod))
}

/// The node's processes other than its daemons: shims, pause and containers.
fn container_pids(node: &RealNode) -> Vec<u32> {
    let daemons = [node.kubelet_pid(), node.containerd_pid(), node.etcd_pid()];
    node.processes()
        .into_iter()
        .filter(|pid| !daemons.contains(&Some(*pid)))
        .collect()
}

/// Prints the resident memory of the plane's processes and of each node's daemons.
fn report_memory(plane: &ControlPlane, nodes: &[RealNode], progress: &Progress) {
    let mib = |pid: Option<u32>| pid.and_then(rss_kib).unwrap_or(0) as f64 / 1024.0;
    let plane_parts = [
        ("kube-apiserver", plane.apiserver_pid()),
        ("kube-controller-manager", plane.controller_manager_pid()),
        ("kube-scheduler", plane.scheduler_pid()),
    ];
    let mut total = 0.0;
    let mut parts = Vec::new();
    for (name, pid) in plane_parts {
        total += mib(pid);
        parts.push(format!("{name} {:.0}", mib(pid)));
    }
    for node in nodes {
        let all: f64 = node.processes().into_iter().map(|pid| mib(Some(pid))).sum();
        total += all;
        parts.push(format!(
            "{}: kubelet {:.0}, containerd {:.0}, etcd {:.0}, all {:.0}",
            node.name(),
            mib(node.kubelet_pid()),
            mib(node.containerd_pid()),
            mib(node.etcd_pid()),
            all
        ));
    }
    progress.say(&format!("RSS in MiB: {}; total {total:.0}", parts.join("; ")));
}

/// The nodes' and the plane's logs a failure is read from.
fn logs(run: &ClusterRun) -> Vec<PathBuf> {
    let workdir = run.plane.workdir();
    let mut logs: Vec<PathBuf> = ["apiserver.log", "controller-manager.log", "scheduler.log"]
        .iter()
        .map(|log| workdir.join(log))
        .collect();
    for node in &run.nodes {
        logs.push(node.kubelet_log());
        logs.push(node.containerd_log());
        logs.extend(node.etcd_log());
    }
    logs
}

/// Copies the plane's and the nodes' logs into the scenario's dir of `target/tmp/e2e-logs/`
/// (`<node>-kubelet.log` …): the work dir goes with the cluster.
fn keep_logs(name: &str, run: &ClusterRun) {
    let target = crate::suite::failure_logs().join(name);
    if std::fs::create_dir_all(&target).is_err() {
        return;
    }
    for log in logs(run) {
        let Some(file) = log.file_name().map(|f| f.to_string_lossy().into_owned()) else {
            continue;
        };
        // A node's logs sit in its dir (`node-N/kubelet.log`), the plane's in the work dir.
        let owner = log
            .parent()
            .filter(|dir| *dir != run.plane.workdir())
            .and_then(|dir| dir.file_name())
            .map(|dir| format!("{}-", dir.to_string_lossy()))
            .unwrap_or_default();
        let _ = std::fs::copy(&log, target.join(format!("{owner}{file}")));
    }
    // Every pod's container logs on each node (the agents', the control plane's).
    for node in &run.nodes {
        if let Some(pods) = node.host_path("/var/log/pods") {
            let _ = std::process::Command::new("cp")
                .arg("-rL")
                .arg(&pods)
                .arg(target.join(format!("{}-pods", node.name())))
                .status();
        }
    }
    eprintln!("--- logs kept in {}", target.display());
}

/// The tails of the nodes' and the plane's logs (long lines cut), unless interrupted.
fn report_failure(run: &ClusterRun) {
    const MAX_LINE: usize = 300;
    if interrupt::requested() {
        return;
    }
    for log in logs(run) {
        let tail: Vec<String> = log_tail(&log, 20)
            .lines()
            .map(|line| line.chars().take(MAX_LINE).collect())
            .collect();
        eprintln!("--- last lines of {} ---\n{}", log.display(), tail.join("\n"));
    }
}
