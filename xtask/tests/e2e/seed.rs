//! The seed scenarios (ARCHITECTURE.md, Self-checkpoint, lock and self-GC): A, the
//! DaemonSet copy checkpoints its parents and itself; B, after a "reboot" without an API
//! server the static copy takes the lock and brings the checkpoints up; C, the DaemonSet copy
//! waits on the lock while the static copy runs, and once the checkpointer's own pod is gone
//! the static copy removes every checkpoint, itself last, and exits; and while the static
//! copy runs, it follows the newest spec of the checkpointer's DaemonSet pod.

use std::fs;

use xtask::e2e_env::NODE_NAME;
use xtask::harness::objects::CHECKPOINT_OF_ANNOTATION;
use xtask::harness::wait::{DEFAULT_TIMEOUT, Probe, wait_for};

use xtask::harness::{files_under, read_manifest};

use crate::suite::{CONFIG_DATA, SECRET_DATA, Scenario};

/// A: inactive checkpoints of the parents with their Secret and ConfigMap files; the self
/// checkpoint active and run by the kubelet (its mirror pod appears).
pub(crate) fn a_checkpoints(ctx: &mut Scenario<'_>) -> anyhow::Result<()> {
    ctx.step("create the checkpointer's DaemonSet pod and an annotated kube-apiserver pod with a Secret and a ConfigMap");
    let me = ctx.create_checkpointer_pod()?;
    let parent = ctx.create_parent_with_data("kube-apiserver")?;
    ctx.expect_api_pod_running(&parent.name)?;

    ctx.step("start the agent as the DaemonSet copy (C1)");
    let dirs = ctx.dirs("node")?;
    let config = ctx.agent_config("c1", &me.name, &dirs);
    let mut c1 = ctx.start_agent(&config)?;
    c1.wait_ready()?;

    ctx.step("the parent's inactive checkpoint, with its Secret and ConfigMap files");
    let checkpoint =
        ctx.expect_checkpoint_where(&dirs, &parent.name, "state inactive and 3 data files", |c| {
            c.state == "inactive" && c.data_files == 3
        })?;
    anyhow::ensure!(
        checkpoint.parent_uid.as_deref() == Some(parent.uid.as_str()),
        "the checkpoint records parent uid {:?}, the parent's is {}",
        checkpoint.parent_uid,
        parent.uid
    );
    let inactive = checkpoint
        .inactive_manifest
        .as_deref()
        .ok_or_else(|| anyhow::anyhow!("no inactive manifest reported"))?;
    let manifest = read_manifest(inactive)?;
    anyhow::ensure!(
        manifest["kind"] == "Pod"
            && manifest["metadata"]["annotations"][CHECKPOINT_OF_ANNOTATION] == parent.name.as_str(),
        "{} is not a checkpoint of {}: {manifest}",
        inactive.display(),
        parent.name
    );
    let volumes = manifest["spec"]["volumes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    anyhow::ensure!(
        !volumes.is_empty() && volumes.iter().all(|v| v["hostPath"].is_object()),
        "the checkpoint's volumes should all be hostPath dirs: {volumes:?}"
    );
    for (kind, object, data) in [
        ("checkpoint-secrets", "kube-apiserver-certs", SECRET_DATA),
        ("checkpoint-configmaps", "kube-apiserver-config", CONFIG_DATA),
    ] {
        for (key, value) in data {
            let path = dirs
                .checkpoint_dir
                .join(kind)
                .join(&ctx.ns)
                .join(&parent.name)
                .join(object)
                .join(key);
            let content = fs::read_to_string(&path)?;
            anyhow::ensure!(
                content == *value,
                "{} holds {content:?}, not {value:?}",
                path.display()
            );
        }
    }
    anyhow::ensure!(
        checkpoint.active_manifest.is_none(),
        "the parent runs: its checkpoint must not be active"
    );

    ctx.step("the self checkpoint is active and the kubelet runs it (mirror pod in the API)");
    let own = ctx.expect_checkpoint(&dirs, &me.name, "active")?;
    let active = own
        .active_manifest
        .ok_or_else(|| anyhow::anyhow!("no active manifest for the self checkpoint"))?;
    anyhow::ensure!(
        active.parent() == Some(dirs.manifests_dir.as_path()),
        "the self checkpoint's static pod {} is not in the kubelet's static pod dir",
        active.display()
    );
    ctx.expect_kubelet_runs(&me.static_name, DEFAULT_TIMEOUT)?;
    ctx.expect_api_pod(&me.static_name, "present (mirror pod)", DEFAULT_TIMEOUT, |_| true)?;

    ctx.step("SIGTERM: the agent exits 0");
    let status = c1.stop()?;
    anyhow::ensure!(status.success(), "the agent exited with {status}");
    Ok(())
}

/// B: a "reboot" without an API server (API killed, C1 killed, the parent's containers
/// gone); the static copy (`POD_NAME=<name>-node-1`, same disk and lock) takes the lock and
/// activates the parent's checkpoint.
pub(crate) fn b_static_copy_takes_over(ctx: &mut Scenario<'_>) -> anyhow::Result<()> {
    ctx.step("create the checkpointer's pod and an annotated kube-apiserver (restartPolicy Never)");
    let me = ctx.create_checkpointer_pod()?;
    let parent = ctx.create_parent_with_data("kube-apiserver")?;
    ctx.expect_api_pod_running(&parent.name)?;

    ctx.step("C1 (the DaemonSet copy) checkpoints the parent and itself");
    let dirs = ctx.dirs("node")?;
    let c1_config = ctx.agent_config("c1", &me.name, &dirs);
    let mut c1 = ctx.start_agent(&c1_config)?;
    c1.wait_ready()?;
    ctx.expect_checkpoint(&dirs, &parent.name, "inactive")?;
    ctx.expect_checkpoint(&dirs, &me.name, "active")?;
    ctx.expect_kubelet_runs(&me.static_name, DEFAULT_TIMEOUT)?;

    ctx.step("\"reboot\" without an API server: API server SIGKILLed, C1 SIGKILLed, the parent's containers stopped");
    ctx.suite.kill_apiserver()?;
    c1.kill()?;
    ctx.crash(&parent.name)?;

    ctx.step("C2 (the static copy, POD_NAME=<name>-node-1, same disk and lock) starts and takes the lock");
    let c2_config = ctx.agent_config("c2-static", &me.static_name, &dirs);
    let mut c2 = ctx.start_agent(&c2_config)?;
    c2.wait_ready()?;
    let holder = ctx.inspect(&dirs)?.lock_holder.unwrap_or_default();
    anyhow::ensure!(
        holder.contains(&me.static_name),
        "the lock should be held by the static copy {}, inspect says: {holder:?}",
        me.static_name
    );

    ctx.step(
        "C2 activates the parent's checkpoint and the kubelet runs it; the self checkpoint stays active",
    );
    let activated = ctx.expect_checkpoint(&dirs, &parent.name, "active")?;
    let static_parent = format!("{}-{NODE_NAME}", parent.name);
    ctx.expect_kubelet_runs(&static_parent, DEFAULT_TIMEOUT)?;
    ctx.expect_checkpoint(&dirs, &me.name, "active")?;
    anyhow::ensure!(
        activated.data_files == 3,
        "the active checkpoint's Secret and ConfigMap files: {} of 3",
        activated.data_files
    );

    ctx.step("the API server comes back: the parent still does not run, so its checkpoint stays active; no self-GC");
    ctx.suite.restart_apiserver()?;
    c2.wait_api_state("synced")?;
    ctx.expect_api_pod(&static_parent, "present (mirror pod)", DEFAULT_TIMEOUT, |_| true)?;
    let inspect = ctx.inspect(&dirs)?;
    for name in [&parent.name, &me.name] {
        let state = inspect.get(&ctx.id(name)).map(|c| c.state.as_str());
        anyhow::ensure!(
            state == Some("active"),
            "{name} should still be active: {}",
            inspect.summary()
        );
    }
    c2.ensure_running()?;

    ctx.step("SIGTERM: C2 exits 0");
    let status = c2.stop()?;
    anyhow::ensure!(status.success(), "the static copy exited with {status}");
    Ok(())
}

/// C: the static copy holds the lock and the DaemonSet copy waits ("standby"); the
/// checkpointer's DaemonSet and its pod are deleted (an uninstall), so the static copy
/// removes every checkpoint (sorted, itself last) and exits 0. (The pod alone deleted,
/// its DaemonSet still targeting the node, is a rollout: see `self_gc.rs`.)
pub(crate) fn c_self_gc(ctx: &mut Scenario<'_>) -> anyhow::Result<()> {
    ctx.step("create the checkpointer's pod and two annotated parents");
    let me = ctx.create_checkpointer_pod()?;
    let apiserver = ctx.create_parent_with_data("kube-apiserver")?;
    let scheduler = ctx.create_plain_parent("kube-scheduler")?;
    ctx.expect_api_pod_running(&apiserver.name)?;

    ctx.step("C2 (the static copy) takes the lock and checkpoints the parents and itself");
    let dirs = ctx.dirs("node")?;
    let mut c2_config = ctx.agent_config("c2-static", &me.static_name, &dirs);
    c2_config.grace_period = Some("2s".into());
    let mut c2 = ctx.start_agent(&c2_config)?;
    c2.wait_ready()?;
    ctx.expect_checkpoint(&dirs, &apiserver.name, "inactive")?;
    ctx.expect_checkpoint(&dirs, &scheduler.name, "inactive")?;
    ctx.expect_checkpoint(&dirs, &me.name, "active")?;

    ctx.step("C1 (the DaemonSet copy) waits on the lock: /readyz 200 \"standby\" (a waiting copy is Ready), /healthz 200");
    let c1_config = ctx.agent_config("c1", &me.name, &dirs);
    let mut c1 = ctx.start_agent(&c1_config)?;
    wait_for("C1 /readyz 200 standby", DEFAULT_TIMEOUT, || {
        c1.ensure_running()?;
        Ok(match c1.http_get("/readyz") {
            Ok((200, body)) if body.trim() == "standby" => Probe::Ready(()),
            Ok((code, body)) => Probe::Waiting(format!("{code} {}", body.trim())),
            Err(e) => Probe::Waiting(format!("{e:#}")),
        })
    })?;
    let (health, _) = c1.http_get("/healthz")?;
    anyhow::ensure!(health == 200, "C1 /healthz answered {health}");
    c2.ensure_running()?;

    ctx.step(
        "delete the checkpointer's DaemonSet and its pod from the API (its kubelet would stop C1 at once)",
    );
    ctx.delete_daemon_set(&me.daemon_set.name)?;
    ctx.delete_pod(&me.name)?;
    let c1_status = c1.stop()?;
    anyhow::ensure!(
        c1_status.success(),
        "C1, stopped while on standby, exited with {c1_status}"
    );

    ctx.step("C2 removes every checkpoint, itself last, and exits 0");
    let status = c2.wait_exit(DEFAULT_TIMEOUT)?;
    anyhow::ensure!(status.success(), "C2 exited with {status} after self-GC");
    let inspect = ctx.inspect(&dirs)?;
    anyhow::ensure!(
        inspect.checkpoints.is_empty(),
        "checkpoints left after self-GC: {}",
        inspect.summary()
    );
    let left: Vec<String> = [
        "inactive-manifests",
        "checkpoint-secrets",
        "checkpoint-configmaps",
    ]
    .iter()
    .flat_map(|d| files_under(&dirs.checkpoint_dir.join(d)))
    .collect();
    anyhow::ensure!(left.is_empty(), "files left after self-GC: {left:?}");

    let log = c2.log_text();
    let removed_at = |name: &str| {
        let needle = format!("pod={} ", ctx.id(name));
        log.lines()
            .position(|l| l.contains("checkpoint removed") && l.contains(&needle))
    };
    let order: Vec<(String, Option<usize>)> = [&apiserver.name, &scheduler.name, &me.name]
        .iter()
        .map(|n| ((*n).clone(), removed_at(n)))
        .collect();
    let lines: Vec<usize> = order.iter().filter_map(|(_, line)| *line).collect();
    anyhow::ensure!(
        lines.len() == order.len() && lines.windows(2).all(|w| w[0] < w[1]),
        "expected \"checkpoint removed\" log lines for {}, {} and then {} (self last); found at lines {order:?}",
        apiserver.name,
        scheduler.name,
        me.name
    );

    ctx.step("the kubelet stops the static copy");
    ctx.expect_kubelet_stopped(&me.static_name)?;
    Ok(())
}

/// C, continued: while the static copy runs, the checkpointer's DaemonSet pod changes (its
/// image is updated, then a rolling update replaces the pod): the static copy follows the
/// newest spec, and a rolled pod never triggers self-GC.
pub(crate) fn c_static_copy_follows_the_daemonset(ctx: &mut Scenario<'_>) -> anyhow::Result<()> {
    const NEW_IMAGE: &str = "registry.invalid/pod-checkpointer-e2e:2";
    ctx.step("create the checkpointer's pod and an annotated parent");
    let me = ctx.create_checkpointer_pod()?;
    let parent = ctx.create_plain_parent("kube-scheduler")?;
    ctx.expect_api_pod_running(&me.name)?;

    ctx.step("C2 (the static copy) takes the lock and checkpoints the parent and itself");
    let dirs = ctx.dirs("node")?;
    let config = ctx.agent_config("c2-static", &me.static_name, &dirs);
    let mut c2 = ctx.start_agent(&config)?;
    c2.wait_ready()?;
    ctx.expect_checkpoint(&dirs, &parent.name, "inactive")?;
    ctx.expect_checkpoint(&dirs, &me.name, "active")?;

    ctx.step("the checkpointer pod's image is updated in the API: its static copy is rewritten with it");
    let patch = format!(r#"[{{"op":"replace","path":"/spec/containers/0/image","value":"{NEW_IMAGE}"}}]"#);
    ctx.suite.kubectl.run(
        &[
            "patch",
            "pod",
            &me.name,
            "-n",
            &ctx.ns,
            "--type=json",
            "-p",
            &patch,
        ],
        None,
    )?;
    ctx.expect_checkpoint_where(
        &dirs,
        &me.name,
        &format!("an active manifest with image {NEW_IMAGE}"),
        |c| {
            c.state == "active"
                && c.active_manifest
                    .as_deref()
                    .and_then(|path| read_manifest(path).ok())
                    .is_some_and(|m| m["spec"]["containers"][0]["image"] == NEW_IMAGE)
        },
    )?;

    ctx.step("rolling update: a new pod of the same DaemonSet replaces the old one");
    let rolled = ctx.create_owned_pod(&me.daemon_set, true)?;
    ctx.expect_checkpoint(&dirs, &rolled.name, "active")?;
    ctx.delete_pod(&me.name)?;

    ctx.step("the old self checkpoint is superseded; no self-GC: the parent's checkpoint stays");
    ctx.expect_no_checkpoint(&dirs, &me.name)?;
    let inspect = ctx.inspect(&dirs)?;
    for (name, state) in [(&rolled.name, "active"), (&parent.name, "inactive")] {
        anyhow::ensure!(
            inspect.get(&ctx.id(name)).is_some_and(|c| c.state == state),
            "expected {name} {state}: {}",
            inspect.summary()
        );
    }
    anyhow::ensure!(
        !c2.log_text().contains("self_gc=true"),
        "a rolled pod of the checkpointer's DaemonSet must not trigger self-GC"
    );
    ctx.expect_kubelet_runs(&format!("{}-{NODE_NAME}", rolled.name), DEFAULT_TIMEOUT)?;

    ctx.step("SIGTERM: C2 exits 0");
    let status = c2.stop()?;
    anyhow::ensure!(status.success(), "the static copy exited with {status}");
    Ok(())
}

/// C as deployed: the static copy has no service-account token (projected tokens are not
/// checkpointed) and no kubeconfig. The DaemonSet copy keeps a kubeconfig with a token of its
/// own ServiceAccount for it (TokenRequest, 0600); the static copy falls back to it, sees the
/// descheduling with it, removes every checkpoint and the kept credentials, and exits 0.
pub(crate) fn c_static_copy_uses_the_kept_credentials(ctx: &mut Scenario<'_>) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;

    ctx.step("create the checkpointer's pod (ServiceAccount pod-checkpointer) and an annotated parent");
    let me = ctx.create_checkpointer_pod()?;
    let parent = ctx.create_parent_with_data("kube-apiserver")?;
    ctx.expect_api_pod_running(&parent.name)?;

    ctx.step("C1 (the DaemonSet copy) checkpoints, and keeps a kubeconfig for the static copy (0600)");
    let dirs = ctx.dirs("node")?;
    let mut c1 = ctx.start_agent(&ctx.agent_config("c1", &me.name, &dirs))?;
    c1.wait_ready()?;
    ctx.expect_checkpoint(&dirs, &parent.name, "inactive")?;
    ctx.expect_checkpoint(&dirs, &me.name, "active")?;
    let kept = dirs.checkpoint_dir.join("pod-checkpointer/kubeconfig");
    wait_for("the kept kubeconfig", DEFAULT_TIMEOUT, || {
        c1.ensure_running()?;
        Ok(if kept.exists() {
            Probe::Ready(())
        } else {
            Probe::Waiting(format!("no {}", kept.display()))
        })
    })?;
    let token = dirs.checkpoint_dir.join("pod-checkpointer/token");
    for file in [&kept, &token] {
        let mode = fs::metadata(file)?.permissions().mode() & 0o777;
        anyhow::ensure!(
            mode == 0o600,
            "{} has mode {mode:o}, expected 600",
            file.display()
        );
    }
    let text = fs::read_to_string(&kept)?;
    anyhow::ensure!(
        text.contains(&format!(
            "system:serviceaccount:{}:pod-checkpointer-static",
            ctx.ns
        )),
        "the kept kubeconfig is not for the static copy's ServiceAccount:\n{text}"
    );

    ctx.step("C1 stops; C2 (the static copy) starts without any kubeconfig and uses the kept one");
    let status = c1.stop()?;
    anyhow::ensure!(status.success(), "C1 exited with {status}");
    let host_default = std::path::Path::new("/etc/kubernetes/kubeconfig");
    anyhow::ensure!(
        !host_default.exists(),
        "{} exists on this machine: the agent would use it instead of the kept credentials",
        host_default.display()
    );
    let mut c2_config = ctx.agent_config("c2-static", &me.static_name, &dirs);
    c2_config.kubeconfig = None;
    c2_config.grace_period = Some("2s".into());
    let mut c2 = ctx.start_agent(&c2_config)?;
    c2.wait_ready()?;
    let log = c2.log_text();
    anyhow::ensure!(
        log.contains("using the API credentials kept for the static copy"),
        "C2 did not say it uses the kept credentials"
    );

    ctx.step(
        "delete the checkpointer's DaemonSet and pod: C2 removes everything, the kept credentials too, and exits 0",
    );
    ctx.delete_daemon_set(&me.daemon_set.name)?;
    ctx.delete_pod(&me.name)?;
    let status = c2.wait_exit(DEFAULT_TIMEOUT)?;
    anyhow::ensure!(status.success(), "C2 exited with {status} after self-GC");
    let inspect = ctx.inspect(&dirs)?;
    anyhow::ensure!(
        inspect.checkpoints.is_empty(),
        "checkpoints left after self-GC: {}",
        inspect.summary()
    );
    for file in [&kept, &token] {
        anyhow::ensure!(!file.exists(), "{} is left after self-GC", file.display());
    }

    ctx.step("the kubelet stops the static copy");
    ctx.expect_kubelet_stopped(&me.static_name)?;
    Ok(())
}
