//! The API server goes away, hung (SIGSTOP: connections accepted, nothing answered) or dead
//! (SIGKILL: connections refused), while the parent's containers have crashed: the parent's
//! checkpoint becomes a static pod the kubelet runs. When the API server is back the
//! checkpoint stays active while the parent does not run; once the parent runs again
//! (re-created, as its controller would) the checkpoint is deactivated. Both transitions
//! are Events on the parent: the activation's, queued during the outage, is published once
//! the API server is back, with the time it happened.

use std::collections::BTreeMap;
use std::time::Duration;

use ckpt_core::Timestamp;
use ckpt_e2e::e2e_env::NODE_NAME;
use ckpt_e2e::wait::{DEFAULT_TIMEOUT, Probe, holds_for, wait_for, waiting_on_error};
use serde_json::Value;

use ckpt_e2e::harness::read_manifest;

use crate::suite::{KUBELET_AFTER_OUTAGE_TIMEOUT, Scenario};

/// How long "no activation while the API server answers" is watched.
const NO_ACTIVATION_WATCH: Duration = Duration::from_secs(3);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Outage {
    Hung,
    Killed,
}

/// How the agent sees what runs on the node.
#[derive(Clone, Copy, PartialEq, Eq)]
enum LocalSource {
    /// The CRI socket (and the kubelet's `/pods`).
    Cri,
    /// `--runtime-endpoint ""`: only the kubelet's `/pods` (a node whose runtime socket is
    /// not reachable).
    KubeletOnly,
}

pub(crate) fn api_hung(ctx: &mut Scenario<'_>) -> anyhow::Result<()> {
    outage(ctx, Outage::Hung, LocalSource::Cri)
}

pub(crate) fn api_killed(ctx: &mut Scenario<'_>) -> anyhow::Result<()> {
    outage(ctx, Outage::Killed, LocalSource::Cri)
}

/// The same with the CRI off: the kubelet's `/pods` alone says what runs.
pub(crate) fn api_killed_kubelet_only(ctx: &mut Scenario<'_>) -> anyhow::Result<()> {
    outage(ctx, Outage::Killed, LocalSource::KubeletOnly)
}

fn outage(ctx: &mut Scenario<'_>, outage: Outage, local: LocalSource) -> anyhow::Result<()> {
    ctx.step("create the checkpointer's pod and an annotated kube-apiserver (restartPolicy Never)");
    let me = ctx.create_checkpointer_pod()?;
    let parent = ctx.create_parent_with_data("kube-apiserver")?;
    ctx.expect_api_pod_running(&parent.name)?;
    let static_parent = format!("{}-{NODE_NAME}", parent.name);

    let dirs = ctx.dirs("node")?;
    let mut config = ctx.agent_config("agent", &me.name, &dirs);
    if local == LocalSource::KubeletOnly {
        ctx.step("start the agent with --runtime-endpoint \"\" (the kubelet's /pods only); the parent's checkpoint is written, inactive");
        config.runtime_endpoint = String::new();
    } else {
        ctx.step("start the agent; the parent's checkpoint is written, inactive");
    }
    let mut agent = ctx.start_agent(&config)?;
    agent.wait_ready()?;
    ctx.expect_checkpoint(&dirs, &parent.name, "inactive")?;

    ctx.step("the parent's containers crash (stopped through the CRI); the API server answers, so nothing is activated");
    ctx.crash(&parent.name)?;
    let pod = ctx.id(&parent.name);
    holds_for("the checkpoint to stay inactive", NO_ACTIVATION_WATCH, || {
        let inspect = ctx.inspect(&dirs)?;
        Ok(match inspect.get(&pod) {
            Some(c) if c.state == "inactive" => Probe::Ready(()),
            _ => Probe::Waiting(inspect.summary()),
        })
    })?;

    match outage {
        Outage::Hung => {
            ctx.step("SIGSTOP the API server (hung): the checkpoint is activated");
            ctx.suite.pause_apiserver()?;
        }
        Outage::Killed => {
            ctx.step("SIGKILL the API server (connection refused): the checkpoint is activated");
            ctx.suite.kill_apiserver()?;
        }
    }
    agent.wait_api_state("unreachable")?;
    let activated = ctx.expect_checkpoint(&dirs, &parent.name, "active")?;
    let active = activated
        .active_manifest
        .ok_or_else(|| anyhow::anyhow!("no active manifest reported"))?;
    let manifest = read_manifest(&active)?;
    anyhow::ensure!(
        manifest["metadata"]["name"] == parent.name.as_str(),
        "the static pod {} is not the parent's: {manifest}",
        active.display()
    );
    if outage == Outage::Killed {
        // With a hung API server the hollow kubelet itself is stuck in API calls, so that
        // case is checked once the API server is back.
        ctx.step("the kubelet runs the static copy while the API server is down");
        ctx.expect_kubelet_runs(&static_parent, KUBELET_AFTER_OUTAGE_TIMEOUT)?;
    }

    ctx.step("the API server comes back; the kubelet runs the static copy (mirror pod in the API)");
    let back = Timestamp::now();
    match outage {
        Outage::Hung => ctx.suite.resume_apiserver()?,
        Outage::Killed => drop(ctx.suite.restart_apiserver()?),
    }
    agent.wait_api_state("synced")?;
    ctx.expect_kubelet_runs(&static_parent, KUBELET_AFTER_OUTAGE_TIMEOUT)?;
    ctx.expect_api_pod(
        &static_parent,
        "present (mirror pod)",
        KUBELET_AFTER_OUTAGE_TIMEOUT,
        |_| true,
    )?;

    ctx.step("the parent is in the API but does not run: the checkpoint stays active");
    let inspect = ctx.inspect(&dirs)?;
    anyhow::ensure!(
        inspect.get(&pod).is_some_and(|c| c.state == "active"),
        "expected {pod} active with the API server back and the parent not running: {}",
        inspect.summary()
    );

    ctx.step("re-create the parent, as its controller would: once it runs, the checkpoint is deactivated");
    let deactivated = ctx.recreate_and_expect_inactive(&dirs, &parent)?;
    anyhow::ensure!(
        !active.exists(),
        "{} is still in the static pod dir",
        active.display()
    );
    anyhow::ensure!(
        deactivated.data_files == 3,
        "data files: {}",
        deactivated.data_files
    );
    ctx.expect_kubelet_stopped(&static_parent)?;

    ctx.step(
        "the parent has its CheckpointActivated Event, from the outage, and its CheckpointDeactivated Event",
    );
    expect_transition_events(ctx, &parent.name, back)?;

    ctx.step("SIGTERM: the agent exits 0");
    let status = agent.stop()?;
    anyhow::ensure!(status.success(), "the agent exited with {status}");
    Ok(())
}

/// Waits until the namespace has the agent's `CheckpointActivated` and
/// `CheckpointDeactivated` Events (`events.k8s.io/v1`) about `parent`, and checks that the
/// activation's time is when it happened, before the API server was `back`.
fn expect_transition_events(ctx: &Scenario<'_>, parent: &str, back: Timestamp) -> anyhow::Result<()> {
    let (events, _) = wait_for(
        "the CheckpointActivated and CheckpointDeactivated Events",
        DEFAULT_TIMEOUT,
        || {
            waiting_on_error((|| {
                let out = ctx.suite.kubectl.run(
                    &["get", "events.v1.events.k8s.io", "-n", &ctx.ns, "-o", "json"],
                    None,
                )?;
                let list: Value = serde_json::from_str(&out)?;
                let events: BTreeMap<String, Value> = (list["items"].as_array().into_iter().flatten())
                    .filter(|e| {
                        e["regarding"]["name"] == parent && e["reportingController"] == "pod-checkpointer"
                    })
                    .filter_map(|e| Some((e["reason"].as_str()?.to_owned(), e.clone())))
                    .collect();
                Ok(
                    if events.contains_key("CheckpointActivated")
                        && events.contains_key("CheckpointDeactivated")
                    {
                        Probe::Ready(events)
                    } else {
                        Probe::Waiting(format!("Events about {parent}: {:?}", events.keys()))
                    },
                )
            })())
        },
    )?;
    let activated = &events["CheckpointActivated"];
    let at = activated["eventTime"]
        .as_str()
        .and_then(Timestamp::parse_rfc3339)
        .ok_or_else(|| anyhow::anyhow!("no eventTime: {activated}"))?;
    anyhow::ensure!(
        at < back,
        "the activation's eventTime {at} is not from the outage (the API server was back at {back}): {activated}"
    );
    anyhow::ensure!(
        activated["note"]
            .as_str()
            .is_some_and(|n| n.contains("while the API server was unreachable")),
        "the activation's note does not say it happened during the outage: {activated}"
    );
    Ok(())
}
