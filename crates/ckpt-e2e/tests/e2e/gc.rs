//! Garbage collection per strategy (ARCHITECTURE.md, GC strategies), with the API server up: a parent is deleted
//! and its checkpoint is removed when the strategy says, Secret and ConfigMap files included.

use std::time::{Duration, Instant};

use ckpt_e2e::harness::agent::{Agent, AgentConfig, AgentDirs};
use ckpt_e2e::progress::human_duration;

use crate::suite::{Parent, Scenario};

/// `immediate`: removed as soon as the parent is gone.
pub(crate) fn immediate(ctx: &mut Scenario<'_>) -> anyhow::Result<()> {
    let (config, parent, mut agent) = start_with_parent(ctx, "immediate", None)?;
    let dirs = config.dirs;

    ctx.step("delete the parent: its checkpoint, Secret and ConfigMap files are removed");
    ctx.delete_pod(&parent.name)?;
    ctx.expect_no_checkpoint(&dirs, &parent.name)?;
    expect_no_files_of(ctx, &dirs, &parent.name)?;

    ctx.step("SIGTERM: the agent exits 0");
    let status = agent.stop()?;
    anyhow::ensure!(status.success(), "the agent exited with {status}");
    Ok(())
}

/// `grace-period`: removed once the parent has been gone for the period, not before; the
/// deadline survives a restart of the agent (state journal).
pub(crate) fn grace_period(ctx: &mut Scenario<'_>) -> anyhow::Result<()> {
    // Long enough to see the pending state and restart the agent within it on a busy machine.
    const GRACE: Duration = Duration::from_secs(8);
    let (config, parent, mut agent) = start_with_parent(ctx, "grace-period", Some("8s"))?;
    let dirs = config.dirs.clone();

    ctx.step("delete the parent: the GC deadline starts, the checkpoint stays for now");
    let deleted = Instant::now();
    ctx.delete_pod(&parent.name)?;
    let pending = ctx.expect_checkpoint_where(&dirs, &parent.name, "a GC deadline (parent absent)", |c| {
        c.parent_absent_since.is_some()
    })?;

    ctx.step("restart the agent: the deadline is kept (state journal), not started again");
    let status = agent.stop()?;
    anyhow::ensure!(status.success(), "the agent exited with {status}");
    let config = AgentConfig {
        label: "agent-restarted".into(),
        ..config
    };
    let mut agent = ctx.start_agent(&config)?;
    agent.wait_ready()?;
    let after_restart = ctx.inspect(&dirs)?;
    let kept = after_restart.get(&ctx.id(&parent.name));
    anyhow::ensure!(
        kept.is_some_and(|c| c.parent_absent_since == pending.parent_absent_since),
        "after the restart the checkpoint should still wait for the deadline that started at {:?}: {}",
        pending.parent_absent_since,
        after_restart.summary()
    );

    ctx.step("after the grace period the checkpoint and its files are removed");
    ctx.expect_no_checkpoint(&dirs, &parent.name)?;
    let after = deleted.elapsed();
    anyhow::ensure!(
        after >= GRACE,
        "removed {} after the delete, before the grace period of {}",
        human_duration(after),
        human_duration(GRACE)
    );
    expect_no_files_of(ctx, &dirs, &parent.name)?;

    ctx.step("SIGTERM: the agent exits 0");
    let status = agent.stop()?;
    anyhow::ensure!(status.success(), "the agent exited with {status}");
    Ok(())
}

/// `owner-reference` with a 5 min grace period: a replacement pod of the same DaemonSet
/// supersedes the old checkpoint at once; a deleted owner removes at once; an owner still
/// present with no pod here falls back to the grace period.
pub(crate) fn owner_reference(ctx: &mut Scenario<'_>) -> anyhow::Result<()> {
    ctx.step(
        "create the checkpointer's pod, and pods of DaemonSets etcd and kube-proxy (objects created by hand)",
    );
    let me = ctx.create_checkpointer_pod()?;
    let (etcd_ds, etcd_old) = ctx.create_daemon_set_pod("etcd", true)?;
    let (proxy_ds, proxy) = ctx.create_daemon_set_pod("kube-proxy", true)?;
    ctx.expect_api_pod_running(&etcd_old.name)?;

    ctx.step("start the agent with --gc-strategy owner-reference --checkpoint-grace-period 5m");
    let dirs = ctx.dirs("node")?;
    let mut config = ctx.agent_config("agent", &me.name, &dirs);
    config.gc_strategy = Some("owner-reference".into());
    config.grace_period = Some("5m".into());
    let mut agent = ctx.start_agent(&config)?;
    agent.wait_ready()?;
    for pod in [&etcd_old, &proxy] {
        let checkpoint = ctx.expect_checkpoint(&dirs, &pod.name, "inactive")?;
        let expected_owner = format!(
            "DaemonSet/{}",
            if pod.name == proxy.name {
                &proxy_ds.name
            } else {
                &etcd_ds.name
            }
        );
        anyhow::ensure!(
            checkpoint.owner.as_deref() == Some(expected_owner.as_str()),
            "the checkpoint of {} records owner {:?}, expected {expected_owner}",
            pod.name,
            checkpoint.owner
        );
    }

    ctx.step(
        "delete kube-proxy's pod (its DaemonSet remains, no replacement here): the grace period applies",
    );
    ctx.delete_pod(&proxy.name)?;
    ctx.expect_checkpoint_where(&dirs, &proxy.name, "a GC deadline (parent absent)", |c| {
        c.parent_absent_since.is_some()
    })?;

    ctx.step("rolling update of etcd: the replacement pod is checkpointed, then the old pod is deleted");
    let etcd_new = ctx.create_owned_pod(&etcd_ds, true)?;
    ctx.expect_checkpoint(&dirs, &etcd_new.name, "inactive")?;
    ctx.delete_pod(&etcd_old.name)?;

    ctx.step("the old etcd checkpoint is superseded and removed at once (not after 5 min)");
    ctx.expect_no_checkpoint(&dirs, &etcd_old.name)?;
    let inspect = ctx.inspect(&dirs)?;
    anyhow::ensure!(
        inspect.get(&ctx.id(&etcd_new.name)).is_some(),
        "the replacement's checkpoint must stay: {}",
        inspect.summary()
    );
    anyhow::ensure!(
        inspect.get(&ctx.id(&proxy.name)).is_some(),
        "kube-proxy's checkpoint must wait for its grace period while its DaemonSet exists: {}",
        inspect.summary()
    );

    ctx.step("delete the kube-proxy DaemonSet: its pod's checkpoint is removed at once");
    ctx.suite
        .kubectl
        .delete_now("daemonset", &ctx.ns, &proxy_ds.name)?;
    ctx.expect_no_checkpoint(&dirs, &proxy.name)?;
    let inspect = ctx.inspect(&dirs)?;
    for name in [&etcd_new.name, &me.name] {
        anyhow::ensure!(
            inspect.get(&ctx.id(name)).is_some(),
            "{name}'s checkpoint must stay: {}",
            inspect.summary()
        );
    }

    ctx.step("SIGTERM: the agent exits 0");
    let status = agent.stop()?;
    anyhow::ensure!(status.success(), "the agent exited with {status}");
    Ok(())
}

/// The checkpointer's pod and an annotated parent with a Secret and a ConfigMap; an agent
/// with `--gc-strategy strategy` (returned with its flags) has checkpointed the parent.
fn start_with_parent(
    ctx: &mut Scenario<'_>,
    strategy: &str,
    grace_period: Option<&str>,
) -> anyhow::Result<(AgentConfig, Parent, Agent)> {
    ctx.step("create the checkpointer's pod and an annotated parent with a Secret and a ConfigMap");
    let me = ctx.create_checkpointer_pod()?;
    let parent = ctx.create_parent_with_data("kube-controller-manager")?;
    ctx.expect_api_pod_running(&parent.name)?;

    ctx.step(&format!(
        "start the agent with --gc-strategy {strategy}{}",
        grace_period
            .map(|g| format!(" --checkpoint-grace-period {g}"))
            .unwrap_or_default()
    ));
    let dirs = ctx.dirs("node")?;
    let mut config = ctx.agent_config("agent", &me.name, &dirs);
    config.gc_strategy = Some(strategy.into());
    config.grace_period = grace_period.map(str::to_owned);
    let mut agent = ctx.start_agent(&config)?;
    agent.wait_ready()?;
    ctx.expect_checkpoint_where(&dirs, &parent.name, "state inactive and 3 data files", |c| {
        c.state == "inactive" && c.data_files == 3
    })?;
    Ok((config, parent, agent))
}

/// No inactive manifest, Secret or ConfigMap file of `name` is left on disk.
fn expect_no_files_of(ctx: &Scenario<'_>, dirs: &AgentDirs, name: &str) -> anyhow::Result<()> {
    let mut left = Vec::new();
    for kind in ["checkpoint-secrets", "checkpoint-configmaps"] {
        let dir = dirs.checkpoint_dir.join(kind).join(&ctx.ns).join(name);
        if dir.exists() {
            left.push(dir.display().to_string());
        }
    }
    for file in ckpt_e2e::harness::files_under(&dirs.checkpoint_dir.join("inactive-manifests")) {
        if file.contains(name) {
            left.push(file);
        }
    }
    anyhow::ensure!(left.is_empty(), "files of {name} left on disk: {left:?}");
    Ok(())
}
