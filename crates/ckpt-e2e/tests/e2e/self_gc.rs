//! Self-GC follows the agent's own DaemonSet, not its pod (ARCHITECTURE.md,
//! Self-checkpoint, lock and self-GC): with the real API server, the agent's pod deleted
//! while its DaemonSet still targets the node removes nothing, even under `immediate`;
//! the DaemonSet no longer targeting the node, or deleted, removes everything, the agent
//! last, once the grace period has passed since the first read saying so (issue 36).

use std::time::{Duration, Instant};

use ckpt_e2e::harness::agent::{Agent, AgentDirs};

use crate::suite::{Parent, Scenario};

/// `immediate`: the agent's pod deleted (a rollout with `maxUnavailable`, an eviction)
/// keeps everything; then the DaemonSet's nodeSelector excludes the node: self-GC, not
/// before the grace period (3 s). It used to come at once, with the default grace period
/// (1 m) unused; issue 36 makes a descheduling wait for the grace period after the first
/// read saying so (one mistaken edit must not wipe the node), so the scenario sets a short
/// one and checks it is waited for.
pub(crate) fn deselected(ctx: &mut Scenario<'_>) -> anyhow::Result<()> {
    const GRACE: Duration = Duration::from_secs(3);
    let (me, parent, dirs, mut agent) = start(ctx, "immediate", Some("3s"))?;

    ctx.step("delete the agent's own pod; its DaemonSet still targets the node: nothing is removed");
    ctx.delete_pod(&me)?;
    ctx.expect_api_pod_gone(&me)?;
    // Several passes (API events, the 1 s runtime poll) while the pod is gone.
    std::thread::sleep(Duration::from_secs(4));
    let kept = ctx.inspect(&dirs)?;
    for name in [&me, &parent.name] {
        anyhow::ensure!(
            kept.get(&ctx.id(name)).is_some(),
            "the checkpoint of {name} must stay while the DaemonSet targets the node: {}",
            kept.summary()
        );
    }
    anyhow::ensure!(agent.exit_status().is_none(), "the agent must keep running");

    ctx.step(
        "the DaemonSet's nodeSelector now excludes the node: after the grace period every checkpoint goes, \
         the agent's last",
    );
    let patch =
        r#"{"spec":{"template":{"spec":{"nodeSelector":{"e2e.pod-checkpointer/elsewhere":"true"}}}}}"#;
    (ctx.suite.kubectl).run(
        &[
            "-n",
            &ctx.ns,
            "patch",
            "daemonset",
            "pod-checkpointer",
            "--type",
            "merge",
            "-p",
            patch,
        ],
        None,
    )?;
    let deselected = Instant::now();
    expect_self_gc(ctx, &mut agent, &dirs, &[&parent.name, &me])?;
    let after = deselected.elapsed();
    anyhow::ensure!(
        after >= GRACE,
        "self-GC {after:?} after the descheduling, before the grace period"
    );
    Ok(())
}

/// `grace-period` (3 s): the agent's DaemonSet and pod deleted: self-GC after the grace
/// period, not before.
pub(crate) fn deleted(ctx: &mut Scenario<'_>) -> anyhow::Result<()> {
    const GRACE: Duration = Duration::from_secs(3);
    let (me, parent, dirs, mut agent) = start(ctx, "grace-period", Some("3s"))?;

    ctx.step("delete the agent's DaemonSet and its pod: self-GC once the grace period has passed");
    let deleted = Instant::now();
    ctx.delete_daemon_set("pod-checkpointer")?;
    ctx.delete_pod(&me)?;
    expect_self_gc(ctx, &mut agent, &dirs, &[&parent.name, &me])?;
    let after = deleted.elapsed();
    anyhow::ensure!(
        after >= GRACE,
        "self-GC {after:?} after the delete, before the grace period"
    );
    Ok(())
}

/// The checkpointer's pod (of its DaemonSet) and a parent, checkpointed by an agent with
/// `--gc-strategy strategy`.
fn start(
    ctx: &mut Scenario<'_>,
    strategy: &str,
    grace: Option<&str>,
) -> anyhow::Result<(String, Parent, AgentDirs, Agent)> {
    ctx.step(&format!(
        "create the checkpointer's pod and a parent; start the agent with --gc-strategy {strategy}"
    ));
    let me = ctx.create_checkpointer_pod()?;
    let parent = ctx.create_plain_parent("kube-scheduler")?;
    ctx.expect_api_pod_running(&parent.name)?;
    let dirs = ctx.dirs("node")?;
    let mut config = ctx.agent_config("agent", &me.name, &dirs);
    config.gc_strategy = Some(strategy.into());
    config.grace_period = grace.map(str::to_owned);
    let mut agent = ctx.start_agent(&config)?;
    agent.wait_ready()?;
    ctx.expect_checkpoint(&dirs, &parent.name, "inactive")?;
    ctx.expect_checkpoint_where(&dirs, &me.name, "the agent's own checkpoint", |_| true)?;
    Ok((me.name, parent, dirs, agent))
}

/// The agent removes the checkpoints of `names` and exits 0.
fn expect_self_gc(
    ctx: &Scenario<'_>,
    agent: &mut Agent,
    dirs: &AgentDirs,
    names: &[&str],
) -> anyhow::Result<()> {
    let status = agent.wait_exit(Duration::from_secs(30))?;
    anyhow::ensure!(status.success(), "self-GC must end with exit 0, not {status}");
    for name in names {
        ctx.expect_no_checkpoint(dirs, name)?;
    }
    let left = ctx.inspect(dirs)?;
    anyhow::ensure!(
        left.checkpoints.is_empty(),
        "nothing may be left after self-GC: {}",
        left.summary()
    );
    Ok(())
}
