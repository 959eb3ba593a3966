//! A true drop-in (issue 40): bootkube's own install of its checkpointer with only the
//! image swapped for ours, and its pull policy set for a node without a registry: the
//! original's DaemonSet (`/checkpoint --lock-file=… --kubeconfig=…
//! --checkpoint-grace-period=…`, the host's whole `/var/run` and `/etc/kubernetes`, no
//! probes, its labels), its `kubeconfig-in-cluster` ConfigMap, and its RBAC, whose Role
//! grants only `get` on Secrets and ConfigMaps and nothing to mint tokens with.
//!
//! Under that Role the agent runs the degraded mode docs/migration.md states: it reads each
//! Secret and ConfigMap a checkpointed pod mounts by GET every minute (as the original did)
//! instead of watching it, and it cannot keep credentials for its static copy, which then
//! runs on an anonymous `/readyz` probe. The scenario shows that this mode still protects
//! the node: the workload and the agent are checkpointed, and in a power cut with the API
//! server down the static copy takes the lock and runs the workload's checkpoint, which
//! reads its Secret and ConfigMap. With render's RBAC added (step 2 of docs/migration.md's
//! procedure applies it) a new DaemonSet pod watches instead of polling and keeps the static
//! copy's credentials, as a render install does; deleting the DaemonSet then removes every
//! checkpoint and the agent, the original's self-GC.

use std::time::{Duration, Instant};

use anyhow::Context;
use ckpt_e2e::e2e_env::NODE_NAME;
use ckpt_e2e::harness::kubectl::pod_running;
use ckpt_e2e::progress::human_duration;
use ckpt_e2e::wait::{Probe, wait_for};
use ckpt_render::{DEFAULT_IMAGE, KubernetesVersion, Manifest, ManifestArgs, render};
use serde_json::{Value, json};

use crate::real_node::NodeRun;
use crate::real_node_seed::{
    NS, count_in_logs, delete_objects, host, label_control_plane, last_log_line, power_cut_without_api,
    reset, restart_count, self_gc_after, state_of, wait_agent_pair_among, wait_inspect, wait_lock_holder_in,
    wait_workload, workload_objects,
};

/// The original's names: its DaemonSet, ServiceAccount, Role and ClusterRole (and their
/// bindings) are all `pod-checkpointer`.
const AGENT: &str = "pod-checkpointer";
/// The original's pod labels (not render's `app.kubernetes.io/name`).
const ORIGINAL_SELECTOR: &str = "k8s-app=pod-checkpointer";
const KUBECONFIG_CONFIG_MAP: &str = "kubeconfig-in-cluster";
/// The original's lock, on the node.
const LOCK_FILE: &str = "/run/lock/pod-checkpointer.lock";
/// The original's default is 5m; short enough here to watch the self-GC.
const GRACE_PERIOD: &str = "20s";
/// The original's nodeSelector (the label kubeadm set before 1.24).
const MASTER_LABEL: &str = "node-role.kubernetes.io/master";
/// What the agent says when it reads an object by GET because it may not list it.
const BY_GET: &str = "list and watch forbidden: reading it by GET instead";
const TIMEOUT: Duration = Duration::from_secs(120);

pub(crate) fn drop_in(run: &mut NodeRun) -> anyhow::Result<()> {
    let progress = run.progress;
    reset(run)?;
    let rbac = render_rbac()?;
    delete_installs(run, &rbac)?;
    label_control_plane(run)?;
    label_master(run, true)?;
    run.kubectl.apply(&workload_objects())?;
    let workload = wait_workload(run, "the workload's pod Running", |_| true)?;

    progress.say(
        "bootkube's install (DaemonSet, kubeconfig-in-cluster, Role with `get` on Secrets and ConfigMaps), our image",
    );
    let server = run.plane.apiserver_url();
    run.kubectl.apply(&original_objects(&server))?;
    let (c1, c2) = wait_agent_pair_among(run, ORIGINAL_SELECTOR, "C1 and its static copy C2 running")?;
    wait_lock_holder_in(&host(run, LOCK_FILE)?, &[&c1])?;
    let checkpoints = wait_inspect(run, "the workload's and the agent's checkpoints", |i| {
        state_of(i, &workload) == Some("inactive")
            && state_of(i, &c1).is_some_and(|s| s.starts_with("active"))
    })?;
    progress.say(&format!(
        "C1 {c1} holds the lock, C2 {c2} runs; checkpoints: {}",
        checkpoints.summary()
    ));
    for (pod, needle) in [
        (&c1, "started with the original's (bootkube's) command line"),
        (&c1, BY_GET),
        (&c2, "no API credentials"),
    ] {
        anyhow::ensure!(
            count_in_logs(run, pod, needle) >= 1,
            "{pod} never logged {needle:?}; its last line: {}",
            last_log_line(run, pod)
        );
    }
    progress.say("C1 reads the Secrets and ConfigMaps by GET; C2 has no credentials to run with");

    progress.say("power cut with the API server down: C2 takes the lock and runs the workload's checkpoint");
    let cut = power_cut_without_api(run, &c1, &workload)?;
    progress.say(&format!(
        "the workload's checkpoint runs and reads the Secret and ConfigMap read by GET, {} after the cut",
        human_duration(cut.elapsed())
    ));

    progress.say("the API server is back: the parents run again and the checkpoint is retired");
    run.plane.restart_apiserver()?;
    let back = Instant::now();
    wait_workload(run, "the workload's parent running again", |pod| {
        pod_running(pod) && restart_count(pod) >= 1
    })?;
    wait_inspect(run, "the workload's checkpoint retired", |i| {
        state_of(i, &workload) == Some("inactive")
    })?;
    progress.say(&format!(
        "parent running and checkpoint retired {} after the API server was back",
        human_duration(back.elapsed())
    ));

    progress.say("render's RBAC added (docs/migration.md, step 2), then a new DaemonSet pod");
    run.kubectl.apply(&rbac)?;
    let (old_c1, _) = wait_agent_pair_among(run, ORIGINAL_SELECTOR, "C1 running again beside C2")?;
    run.kubectl
        .run(&["delete", "pod", "-n", NS, &old_c1, "--wait=true"], None)?;
    // Deleted with --wait: the pair found next is the new pod and its own static copy.
    let (c1, c2) = wait_agent_pair_among(run, ORIGINAL_SELECTOR, "a new C1 and its static copy")?;
    anyhow::ensure!(c1 != old_c1, "{old_c1} was deleted but is listed again");
    wait_lock_holder_in(&host(run, LOCK_FILE)?, &[&c1, &c2])?;
    wait_for("credentials kept for the static copy", TIMEOUT, || {
        Ok(
            if count_in_logs(run, &c1, "kept fresh API credentials for the static copy") >= 1 {
                Probe::Ready(())
            } else {
                Probe::Waiting(format!("C1's last line: {}", last_log_line(run, &c1)))
            },
        )
    })?;
    anyhow::ensure!(
        count_in_logs(run, &c1, BY_GET) == 0,
        "{c1} still reads objects by GET under render's Role"
    );
    wait_inspect(run, "the workload's and the new pod's checkpoints", |i| {
        state_of(i, &workload) == Some("inactive")
            && state_of(i, &c1).is_some_and(|s| s.starts_with("active"))
    })?;
    progress.say(&format!(
        "{c1} holds the lock, watches the Secrets and ConfigMaps and keeps the static copy's credentials"
    ));

    progress.say("the DaemonSet deleted: the static copy removes every checkpoint, then itself");
    self_gc_after(
        run,
        ORIGINAL_SELECTOR,
        &["delete", "daemonset", AGENT, "-n", NS],
        &[&workload, &c1],
    )?;
    delete_installs(run, &rbac)?;
    label_master(run, false)?;
    delete_objects(run)
}

/// bootkube's pod-checkpointer objects (its `pod-checkpointer.yaml`,
/// `pod-checkpointer-role*.yaml` and `kubeconfig-in-cluster.yaml` templates), the image
/// ours, the pull policy `IfNotPresent`, containerd's socket named as downstream installs
/// did, and a shorter grace period.
fn original_objects(server: &str) -> Vec<Value> {
    let labels = json!({ "tier": "control-plane", "k8s-app": AGENT });
    let rule = |resources: &[&str], verbs: &[&str]| json!({ "apiGroups": [""], "resources": resources, "verbs": verbs });
    let subjects = json!([{ "kind": "ServiceAccount", "name": AGENT, "namespace": NS }]);
    let role_ref =
        |kind: &str| json!({ "apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": AGENT });
    let kubeconfig = format!(
        "apiVersion: v1\nclusters:\n- name: local\n  cluster:\n    server: {server}\n    \
         certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt\n\
         users:\n- name: service-account\n  user:\n    \
         tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token\n\
         contexts:\n- context:\n    cluster: local\n    user: service-account\n"
    );
    let env =
        |name: &str, path: &str| json!({ "name": name, "valueFrom": { "fieldRef": { "fieldPath": path } } });
    vec![
        json!({ "apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": { "name": AGENT, "namespace": NS } }),
        json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": { "name": AGENT, "namespace": NS },
                "rules": [rule(&["pods"], &["get", "watch", "list"]),
                          rule(&["secrets", "configmaps"], &["get"])] }),
        json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": { "name": AGENT, "namespace": NS },
                "roleRef": role_ref("Role"), "subjects": subjects }),
        json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": { "name": AGENT },
                "rules": [rule(&["nodes", "nodes/proxy"], &["get"])] }),
        json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": { "name": AGENT },
                "roleRef": role_ref("ClusterRole"), "subjects": subjects }),
        json!({ "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": { "name": KUBECONFIG_CONFIG_MAP, "namespace": NS },
                "data": { "kubeconfig": kubeconfig } }),
        json!({
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": { "name": AGENT, "namespace": NS, "labels": labels },
            "spec": {
                "selector": { "matchLabels": labels },
                "updateStrategy": { "type": "RollingUpdate", "rollingUpdate": { "maxUnavailable": 1 } },
                "template": {
                    "metadata": {
                        "labels": labels,
                        "annotations": { "checkpointer.alpha.coreos.com/checkpoint": "true" }
                    },
                    "spec": {
                        "containers": [{
                            "name": AGENT,
                            "image": DEFAULT_IMAGE,
                            "imagePullPolicy": "IfNotPresent",
                            "command": [
                                "/checkpoint",
                                "--lock-file=/var/run/lock/pod-checkpointer.lock",
                                "--kubeconfig=/etc/checkpointer/kubeconfig",
                                format!("--checkpoint-grace-period={GRACE_PERIOD}"),
                                "--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock"
                            ],
                            "env": [env("NODE_NAME", "spec.nodeName"),
                                    env("POD_NAME", "metadata.name"),
                                    env("POD_NAMESPACE", "metadata.namespace")],
                            "volumeMounts": [
                                { "mountPath": "/etc/checkpointer", "name": "kubeconfig" },
                                { "mountPath": "/etc/kubernetes", "name": "etc-kubernetes" },
                                { "mountPath": "/var/run", "name": "var-run" }
                            ]
                        }],
                        "serviceAccountName": AGENT,
                        "hostNetwork": true,
                        "nodeSelector": { MASTER_LABEL: "" },
                        "restartPolicy": "Always",
                        "tolerations": [
                            { "key": MASTER_LABEL, "operator": "Exists", "effect": "NoSchedule" }
                        ],
                        "volumes": [
                            { "name": "kubeconfig", "configMap": { "name": KUBECONFIG_CONFIG_MAP } },
                            { "name": "etc-kubernetes", "hostPath": { "path": "/etc/kubernetes" } },
                            { "name": "var-run", "hostPath": { "path": "/var/run" } }
                        ]
                    }
                }
            }
        }),
    ]
}

/// What render adds to the original's RBAC: its ServiceAccounts, Roles and bindings, as
/// `render --lock-file /var/run/lock/pod-checkpointer.lock` writes them (the same names
/// replace the original's Role and ClusterRole).
fn render_rbac() -> anyhow::Result<Vec<Value>> {
    let options = ManifestArgs {
        lock_file: "/var/run/lock/pod-checkpointer.lock".to_owned(),
        ..ManifestArgs::default()
    }
    .options_for(KubernetesVersion::NEWEST, &ckpt_bin::render::BuiltIn)?;
    render(&options)
        .iter()
        .filter(|m| {
            matches!(
                m,
                Manifest::ServiceAccount(_)
                    | Manifest::Role(_)
                    | Manifest::RoleBinding(_)
                    | Manifest::ClusterRole(_)
                    | Manifest::ClusterRoleBinding(_)
            )
        })
        .map(|m| serde_json::to_value(m).context("a rendered object as JSON"))
        .collect()
}

/// Deletes what either install creates beside the DaemonSet: render's ServiceAccounts,
/// Roles and bindings (`rbac`, the original's names among them) and the original's
/// kubeconfig ConfigMap. Also before the scenario: `deploy` in an earlier one leaves its
/// RBAC, which would let the agent mint the static copy's token.
fn delete_installs(run: &NodeRun, rbac: &[Value]) -> anyhow::Result<()> {
    let mut names: Vec<(String, String, Option<String>)> = rbac
        .iter()
        .map(|o| {
            (
                o["kind"].as_str().unwrap_or_default().to_lowercase(),
                o["metadata"]["name"].as_str().unwrap_or_default().to_owned(),
                o["metadata"]["namespace"].as_str().map(str::to_owned),
            )
        })
        .collect();
    names.push(("configmap".into(), KUBECONFIG_CONFIG_MAP.into(), Some(NS.into())));
    for (kind, name, namespace) in &names {
        let mut args = vec!["delete", kind, name, "--ignore-not-found"];
        if let Some(ns) = namespace {
            args.extend(["-n", ns]);
        }
        run.kubectl.run(&args, None)?;
    }
    Ok(())
}

/// Sets (or removes) the label the original's DaemonSet selects nodes by.
fn label_master(run: &NodeRun, set: bool) -> anyhow::Result<()> {
    let label = if set {
        format!("{MASTER_LABEL}=")
    } else {
        format!("{MASTER_LABEL}-")
    };
    run.kubectl
        .run(&["label", "node", NODE_NAME, &label, "--overwrite"], None)?;
    Ok(())
}
