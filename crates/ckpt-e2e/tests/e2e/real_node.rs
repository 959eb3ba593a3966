//! The real node on its own (issue 16, "The node"): a plane with the controllers and the node
//! network, kubelet + containerd + runc running real containers, a power-cut reboot, and a
//! stop that leaves nothing behind. It measures the node's start, its reboot and the
//! daemons' resident memory.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use ckpt_e2e::e2e_env::real_node::BUSYBOX_IMAGE;
use ckpt_e2e::e2e_env::{ControlPlane, NODE_NAME, RealNode, RealNodeOptions, StartOptions};
use ckpt_e2e::harness::kubectl::{Kubectl, pod_running};
use ckpt_e2e::interrupt;

use crate::group::{Group, SharedEnv};
use ckpt_e2e::process::{log_tail, rss_kib};
use ckpt_e2e::progress::Progress;
use ckpt_e2e::progress::human_duration;
use ckpt_e2e::wait::{Probe, wait_for, waiting_on_error};
use serde_json::{Value, json};

const NAMESPACE: &str = "real-node";
/// The static pod's hostPath, on the node's disk (`/etc/kubernetes` is the node's own).
const STATIC_POD_DIR: &str = "/etc/kubernetes/e2e-real-node";
const STATIC_POD: &str = "e2e-static";
const DAEMON_SET: &str = "e2e-api";
/// Pods are created, scheduled and started by real components here: generous bounds.
const TIMEOUT: Duration = Duration::from_secs(90);

/// Paths only a node would create on the machine (no other tool here makes them, unlike
/// `/etc/cni/net.d` or `/var/lib/cni`): their existence is compared before, during and after
/// the run. That the node's writes land in its own dirs is checked inside the node.
const MACHINE_PATHS: [&str; 9] = [
    "/etc/kubernetes",
    "/var/lib/kubelet",
    "/var/lib/containerd",
    "/var/log/pods",
    "/var/log/containers",
    "/run/containerd",
    "/run/pod-checkpointer",
    "/opt/containerd",
    "/usr/libexec/kubernetes",
];

/// The node paths that must be mounts of the node's own dirs (the rest of its `/run` too).
const NODE_MOUNTS: [&str; 8] = [
    "/etc/kubernetes",
    "/etc/cni/net.d",
    "/var/lib/kubelet",
    "/var/lib/containerd",
    "/var/lib/cni",
    "/var/log/pods",
    "/var/log/containers",
    "/run",
];

/// The plane and real node every real-node scenario of a run shares, with what they need.
pub(crate) struct NodeRun {
    pub(crate) plane: ControlPlane,
    pub(crate) node: RealNode,
    pub(crate) kubectl: Kubectl,
    pub(crate) progress: Progress,
    /// Which of [`MACHINE_PATHS`] existed before the start.
    machine_before: Vec<PathBuf>,
}

/// The real-node scenarios' group: one plane and real node for all of them.
pub(crate) const GROUP: Group<NodeRun> = Group {
    on: "a real node",
    start,
    stop,
    stop_check: "real_node_stop_leaves_nothing",
};

impl SharedEnv for NodeRun {
    fn keep_logs(&self, scenario: &str) {
        keep_logs(scenario, &self.plane, &self.node);
    }

    fn report_failure(&self) {
        report_failure(&self.plane, &self.node);
    }

    fn failure_digest(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for log in [self.node.kubelet_log(), self.node.containerd_log()] {
            for line in ckpt_e2e::process::log_error_lines(&log, 6) {
                let file = log.file_name().unwrap_or_default().to_string_lossy();
                lines.push(format!("  {file}: {line}"));
            }
        }
        lines
    }
}

fn start(progress: Progress) -> anyhow::Result<NodeRun> {
    let machine_before = existing(&MACHINE_PATHS);
    let bins = ckpt_e2e::e2e_env::cached_bins(ckpt_e2e::e2e_env::Release::from_env()?)?;
    let plane = ControlPlane::start(&StartOptions::real_node(bins.clone()))?;
    progress.say("the agent's images (the static release build), then the real node");
    let images = crate::real_node_seed::agent_images(&plane.workdir().join("images"))?;
    let node = RealNode::start(
        &plane,
        &RealNodeOptions {
            images,
            ..RealNodeOptions::new(bins)
        },
    )?;
    let kubectl = Kubectl::new(&plane.kubeconfig(), &plane.workdir().join("kubectl-cache"));
    Ok(NodeRun {
        plane,
        node,
        kubectl,
        progress,
        machine_before,
    })
}

/// Stops the node and the plane; what the running node made on the machine (taken before
/// the stop, so the same check could fail) must all be gone afterwards.
fn stop(run: NodeRun) -> anyhow::Result<()> {
    let NodeRun {
        plane,
        node,
        progress,
        machine_before,
        ..
    } = run;
    let workdir = plane.workdir().to_owned();
    // A container running at the stop, so its cgroups and shim are in the footprint too.
    write_manifest(&node.manifests_dir(), FOOTPRINT_POD, &footprint_pod())?;
    let kinds = [
        "processes",
        "mount",
        "network namespace",
        "link",
        "route",
        "cgroup",
    ];
    let (footprint, _) = wait_for("a container in the node's footprint", TIMEOUT, || {
        let footprint = node.footprint();
        let running = footprint.survivors();
        Ok(
            match kinds
                .iter()
                .find(|kind| !running.iter().any(|s| s.starts_with(*kind)))
            {
                None => Probe::Ready(footprint),
                Some(kind) => Probe::Waiting(format!("no {kind} in {running:?}")),
            },
        )
    })?;
    progress.say(&format!(
        "stopping the node ({} processes) and the plane",
        footprint.process_count()
    ));
    node.stop()?;
    plane.stop()?;
    let survivors = footprint.survivors();
    anyhow::ensure!(
        survivors.is_empty(),
        "the node left behind: {}",
        survivors.join("; ")
    );
    anyhow::ensure!(!workdir.exists(), "{} survives the stop", workdir.display());
    anyhow::ensure!(
        existing(&MACHINE_PATHS) == machine_before,
        "the machine's directories changed: before {machine_before:?}, after {:?}",
        existing(&MACHINE_PATHS)
    );
    progress.say("nothing of the node survives the stop");
    Ok(())
}

/// The node itself: its namespaces and directories, a static pod, a DaemonSet's pod that
/// calls the API with its bound token, and both back after a power cut. Leaves nothing.
pub(crate) fn runs_pods_and_reboots(run: &mut NodeRun) -> anyhow::Result<()> {
    exercise(&run.progress, &run.plane, &mut run.node, &run.kubectl)?;
    run.progress
        .say("clean-up: the static pod's manifest, its hostPath dir and the namespace");
    fs::remove_file(run.node.manifests_dir().join(format!("{STATIC_POD}.json")))?;
    run.kubectl
        .run(&["delete", "namespace", NAMESPACE, "--wait=true"], None)?;
    // What the static pod wrote on the node's disk, once it is gone; left behind, the
    // next scenario took it for what a failed one leaves.
    let written = run
        .node
        .host_path(STATIC_POD_DIR)
        .context("the static pod's dir is not one of the node's own")?;
    fs::remove_dir_all(&written).with_context(|| format!("cannot remove {}", written.display()))?;
    Ok(())
}

fn exercise(
    progress: &Progress,
    plane: &ControlPlane,
    node: &mut RealNode,
    kubectl: &Kubectl,
) -> anyhow::Result<()> {
    let machine_paths = existing(&MACHINE_PATHS);

    progress.say("the node: Ready, its address, no default route, private directories");
    let node_object = get(kubectl, "node", "", NODE_NAME)?.context("no Node node-1")?;
    let addresses = node_object["status"]["addresses"].to_string();
    let node_ip = node.network().node_ip.to_string();
    anyhow::ensure!(
        addresses.contains(&node_ip),
        "node addresses {addresses} lack {node_ip}"
    );
    let default_routes = node.exec(&["ip", "-4", "route", "show", "default"])?;
    anyhow::ensure!(
        default_routes.trim().is_empty(),
        "the node has a default route: {default_routes}"
    );
    let inside = node.exec(&["ls", "/etc/kubernetes"])?;
    anyhow::ensure!(
        inside.lines().any(|l| l == "manifests"),
        "the node's /etc/kubernetes holds {inside:?}"
    );
    for path in NODE_MOUNTS {
        let own = node.host_path(path).context("not a path of the node's own")?;
        let own = own.strip_prefix(node.dir().parent().unwrap_or(node.dir()))?;
        // `findmnt` names a bind mount's source as DEVICE[/path/on/that/device].
        let sources = node.exec(&[
            "findmnt",
            "--noheadings",
            "--output",
            "SOURCE",
            "--mountpoint",
            path,
        ])?;
        anyhow::ensure!(
            !sources.trim().is_empty()
                && sources
                    .lines()
                    .all(|source| source.trim_end().ends_with(&format!("{}]", own.display()))),
            "{path} inside the node is not {}: {sources:?}",
            own.display()
        );
    }
    anyhow::ensure!(
        existing(&MACHINE_PATHS) == machine_paths,
        "starting the node changed the machine's directories"
    );

    kubectl.run(&["create", "namespace", NAMESPACE], None)?;

    progress.say("a static pod: busybox from the manifests dir, on the node's disk");
    let started_log = node
        .host_path(format!("{STATIC_POD_DIR}/started.log"))
        .context("the static pod's dir is not on the node's disk")?;
    write_manifest(&node.manifests_dir(), STATIC_POD, &static_pod())?;
    let mirror = format!("{STATIC_POD}-{NODE_NAME}");
    let ((), took) = wait_for("the static pod's first start", TIMEOUT, || {
        Ok(match line_count(&started_log) {
            0 => Probe::Waiting("started.log is empty".into()),
            _ => Probe::Ready(()),
        })
    })?;
    progress.say(&format!("static pod running after {}", human_duration(took)));
    wait_pod(kubectl, &mirror, "its mirror pod Running", pod_running)?;

    progress.say("an API pod: a DaemonSet scheduled onto the node, calling the API with its bound token");
    kubectl.apply(&api_pod_objects(&plane.apiserver_url()))?;
    let pod = wait_api_pod(kubectl, "the DaemonSet's pod Running", pod_running)?;
    let pod_name = pod["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    let pod_ip = pod["status"]["podIP"].as_str().unwrap_or_default().to_owned();
    let pod_cidr_prefix = node.network().pod_cidr_text();
    let pod_cidr_prefix = pod_cidr_prefix.rsplit_once('.').map_or("", |(net, _)| net);
    anyhow::ensure!(
        pod_ip.starts_with(pod_cidr_prefix),
        "the pod's IP {pod_ip} is not in the node's pod CIDR"
    );
    let projected = pod["spec"]["volumes"].as_array().is_some_and(|volumes| {
        volumes.iter().any(|v| {
            v["projected"]["sources"]
                .as_array()
                .is_some_and(|s| s.iter().any(|s| s["serviceAccountToken"].is_object()))
        })
    });
    anyhow::ensure!(
        projected,
        "the pod has no projected service-account token: {}",
        pod["spec"]["volumes"]
    );
    let expected = format!("self via API: \"podIP\":\"{pod_ip}\"");
    wait_for(
        "the pod to read itself through the API (its logs via the kubelet)",
        TIMEOUT,
        || {
            waiting_on_error((|| {
                let logs = kubectl.run(&["logs", "-n", NAMESPACE, &pod_name], None)?;
                Ok(if logs.contains(&expected) {
                    Probe::Ready(())
                } else {
                    Probe::Waiting(format!("logs: {:?}", logs.lines().last().unwrap_or("")))
                })
            })())
        },
    )?;

    let rss = |pid: Option<u32>| {
        pid.and_then(rss_kib)
            .map_or("?".to_owned(), |kib| format!("{:.1} MiB", kib as f64 / 1024.0))
    };
    progress.say(&format!(
        "resident: kubelet {}, containerd {}; {} node processes",
        rss(node.kubelet_pid()),
        rss(node.containerd_pid()),
        node.processes().len()
    ));

    progress.say("reboot: power cut, runtime state dropped, containerd and the kubelet again");
    let starts_before = line_count(&started_log);
    let api_restarts = restart_count(&wait_api_pod(kubectl, "the API pod", |_| true)?);
    let cut = Instant::now();
    node.reboot()?;
    let ((), _) = wait_for("the static pod to run again", TIMEOUT, || {
        let starts = line_count(&started_log);
        Ok(if starts > starts_before {
            Probe::Ready(())
        } else {
            Probe::Waiting(format!("{starts} start(s) in started.log"))
        })
    })?;
    let static_back = cut.elapsed();
    wait_api_pod(kubectl, "the API pod running again in a new sandbox", |pod| {
        pod_running(pod) && restart_count(pod) > api_restarts
    })?;
    let api_back = cut.elapsed();
    wait_pod(kubectl, &mirror, "the mirror pod Running again", pod_running)?;
    progress.say(&format!(
        "after the power cut: static pod running in {}, API pod in {}",
        human_duration(static_back),
        human_duration(api_back)
    ));
    progress.say(&format!(
        "resident after the reboot: kubelet {}, containerd {}",
        rss(node.kubelet_pid()),
        rss(node.containerd_pid())
    ));
    anyhow::ensure!(
        existing(&MACHINE_PATHS) == machine_paths,
        "the reboot changed the machine's directories"
    );
    Ok(())
}

/// A static pod that only sleeps, running while the node is stopped.
const FOOTPRINT_POD: &str = "e2e-footprint";

fn footprint_pod() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": FOOTPRINT_POD, "namespace": "default" },
        "spec": {
            "hostNetwork": true,
            "containers": [{
                "name": "sleep",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sleep", "100000"]
            }]
        }
    })
}

/// A hostNetwork busybox that appends a line to its hostPath file at each start.
fn static_pod() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": STATIC_POD, "namespace": NAMESPACE },
        "spec": {
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "writer",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", "echo started $(date +%s) >> /data/started.log; exec sleep 100000"],
                "volumeMounts": [{ "name": "data", "mountPath": "/data" }]
            }],
            "volumes": [{
                "name": "data",
                "hostPath": { "path": STATIC_POD_DIR, "type": "DirectoryOrCreate" }
            }]
        }
    })
}

/// A DaemonSet whose pod reads itself through the API with its projected token (the default
/// ServiceAccount, allowed to get pods), plus that Role and binding. Not wget's own
/// User-Agent: the API server pretty-prints JSON for it.
fn api_pod_objects(api_url: &str) -> Vec<Value> {
    let script = r#"while true; do
  token=$(cat /var/run/secrets/kubernetes.io/serviceaccount/token)
  if wget -q -O /tmp/self -U pod-checkpointer-e2e --no-check-certificate --header "Authorization: Bearer $token" "$API_URL/api/v1/namespaces/$NAMESPACE/pods/$(hostname)"; then
    echo "self via API: $(grep -o '"podIP":"[^"]*"' /tmp/self | head -n 1)"
  else
    echo "the API call failed"
  fi
  sleep 3
done"#;
    vec![
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": { "name": "pod-reader", "namespace": NAMESPACE },
            "rules": [{ "apiGroups": [""], "resources": ["pods"], "verbs": ["get"] }]
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": { "name": "pod-reader", "namespace": NAMESPACE },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader" },
            "subjects": [{ "kind": "ServiceAccount", "name": "default", "namespace": NAMESPACE }]
        }),
        json!({
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": { "name": DAEMON_SET, "namespace": NAMESPACE },
            "spec": {
                "selector": { "matchLabels": { "app": DAEMON_SET } },
                "template": {
                    "metadata": { "labels": { "app": DAEMON_SET } },
                    "spec": {
                        "terminationGracePeriodSeconds": 2,
                        "containers": [{
                            "name": "api",
                            "image": BUSYBOX_IMAGE,
                            "imagePullPolicy": "Never",
                            "env": [
                                { "name": "API_URL", "value": api_url },
                                { "name": "NAMESPACE", "value": NAMESPACE }
                            ],
                            "command": ["/bin/sh", "-c", script]
                        }]
                    }
                }
            }
        }),
    ]
}

/// Writes a manifest under a dot-name and renames it in (the kubelet skips dot files).
pub(crate) fn write_manifest(dir: &Path, name: &str, pod: &Value) -> anyhow::Result<()> {
    let hidden = dir.join(format!(".{name}.json"));
    fs::write(&hidden, format!("{pod:#}\n")).with_context(|| format!("cannot write {}", hidden.display()))?;
    fs::rename(&hidden, dir.join(format!("{name}.json")))?;
    Ok(())
}

fn get(kubectl: &Kubectl, resource: &str, namespace: &str, name: &str) -> anyhow::Result<Option<Value>> {
    if namespace.is_empty() {
        let out = kubectl.run(&["get", resource, name, "--ignore-not-found", "-o", "json"], None)?;
        return Ok(if out.trim().is_empty() {
            None
        } else {
            Some(serde_json::from_str(&out)?)
        });
    }
    kubectl.get(resource, namespace, name)
}

fn wait_pod(
    kubectl: &Kubectl,
    name: &str,
    expected: &str,
    check: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    let (pod, _) = wait_for(expected, TIMEOUT, || {
        waiting_on_error((|| {
            Ok(match kubectl.get("pod", NAMESPACE, name)? {
                Some(pod) if check(&pod) => Probe::Ready(pod),
                Some(pod) => Probe::Waiting(format!("status {}", pod["status"])),
                None => Probe::Waiting("no such pod".into()),
            })
        })())
    })?;
    Ok(pod)
}

/// The DaemonSet's one pod, once `check` holds for it.
fn wait_api_pod(kubectl: &Kubectl, expected: &str, check: impl Fn(&Value) -> bool) -> anyhow::Result<Value> {
    let (pod, _) = wait_for(expected, TIMEOUT, || {
        waiting_on_error((|| {
            let pods = kubectl.pods(NAMESPACE, &format!("app={DAEMON_SET}"))?;
            Ok(match pods.as_slice() {
                [pod] if check(pod) => Probe::Ready(pod.clone()),
                [pod] => Probe::Waiting(format!("status {}", pod["status"])),
                pods => Probe::Waiting(format!("{} pods", pods.len())),
            })
        })())
    })?;
    Ok(pod)
}

fn restart_count(pod: &Value) -> u64 {
    pod["status"]["containerStatuses"][0]["restartCount"]
        .as_u64()
        .unwrap_or(0)
}

fn line_count(path: &Path) -> usize {
    fs::read_to_string(path).map_or(0, |text| text.lines().count())
}

fn existing(paths: &[&str]) -> Vec<PathBuf> {
    paths.iter().map(PathBuf::from).filter(|p| p.exists()).collect()
}

/// The node's and the plane's logs a failure is read from.
fn node_and_plane_logs(plane: &ControlPlane, node: &RealNode) -> [PathBuf; 5] {
    [
        node.kubelet_log(),
        node.containerd_log(),
        plane.workdir().join("apiserver.log"),
        plane.workdir().join("controller-manager.log"),
        plane.workdir().join("scheduler.log"),
    ]
}

/// Copies the plane's and the node's logs, and every pod's container logs on the node (its
/// `/var/log/pods`: the agent's, the self-hosted control plane's), into the scenario's dir
/// of `target/tmp/e2e-logs/`, as the hollow-node scenarios keep theirs: the work dir goes
/// with the node, and a real-node failure is read from these.
fn keep_logs(name: &str, plane: &ControlPlane, node: &RealNode) {
    let target = crate::suite::failure_logs().join(name);
    if std::fs::create_dir_all(&target).is_err() {
        return;
    }
    let logs = node_and_plane_logs(plane, node);
    for log in logs.iter().chain([&plane.workdir().join("etcd.log")]) {
        if let Some(file) = log.file_name() {
            let _ = std::fs::copy(log, target.join(file));
        }
    }
    if let Some(pods) = node.host_path("/var/log/pods") {
        let copied = std::process::Command::new("cp")
            .arg("-rL")
            .arg(&pods)
            .arg(target.join("pods"))
            .status();
        if !copied.is_ok_and(|status| status.success()) {
            eprintln!("--- the pod logs in {} could not all be copied", pods.display());
        }
    }
    eprintln!("--- logs kept in {} (pod logs under pods/)", target.display());
}

/// The tails of the node's and the plane's logs (long lines cut), unless interrupted.
fn report_failure(plane: &ControlPlane, node: &RealNode) {
    const MAX_LINE: usize = 300;
    if interrupt::requested() {
        return;
    }
    for log in node_and_plane_logs(plane, node) {
        let name = log.file_name().unwrap_or_default().to_string_lossy();
        let tail: Vec<String> = log_tail(&log, 30)
            .lines()
            .map(|line| line.chars().take(MAX_LINE).collect())
            .collect();
        eprintln!("--- last lines of {name} ---\n{}", tail.join("\n"));
    }
}
