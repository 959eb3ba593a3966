//! The network between the agent and the real kube-apiserver misbehaves (issue 18's fault
//! campaign, on the real API server): the agent's kubeconfig names a TCP fault proxy
//! (`ckpt_testkit::FaultProxy`) in front of the API server, while the kubelet talks to the
//! API server directly, as it would on a node whose route to a load balancer broke.
//!
//! 1. Half-open: every open connection of the agent silenced for good, without a close (a
//!    lost NAT entry), then the parent's Secret rotated: the new content reaches the
//!    checkpoint (before the fix it waited for the watches' five-minute idle timeout).
//! 2. Blackhole: nothing passes. The agent counts the API unreachable and activates the
//!    checkpoint of the parent whose containers crashed; the kubelet runs it. Back: synced,
//!    and the checkpoint stays active while the parent does not run.
//! 3. Reset: every connection reset at once. Unreachable, then synced again.
//! 4. The parent re-created: the checkpoint steps aside.
//!
//! Throughout the faults the agent's connections stay bounded (at most 5 new ones a second
//! and 8 open, as the in-process tests allow); the figures are printed for RELIABILITY.md.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use ckpt_e2e::e2e_env::{AGENT_USER, NODE_NAME};
use ckpt_e2e::harness::objects::secret;
use ckpt_e2e::wait::{DEFAULT_TIMEOUT, Probe, holds_for, wait_for};
use ckpt_testkit::{FaultProxy, NetFault};

use crate::suite::{KUBELET_AFTER_OUTAGE_TIMEOUT, Scenario};

/// How long each fault is held once the agent has noticed it, counting connections.
const HOLD: Duration = Duration::from_secs(10);

/// New connections a second the agent may open to a broken network, and how many it may
/// hold open (the in-process tests' bounds).
const MAX_CONNECTIONS_PER_SEC: f64 = 5.0;
const MAX_OPEN: u64 = 8;

pub(crate) fn faults(ctx: &mut Scenario<'_>) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("cannot start the proxy's runtime")?;
    let upstream = SocketAddr::from(([127, 0, 0, 1], ctx.suite.plane.apiserver_port()));
    let proxy = runtime.block_on(FaultProxy::start(upstream));
    let kubeconfig = ctx.suite.plane.write_kubeconfig(
        "kubeconfig-agent-via-fault-proxy",
        &format!("https://127.0.0.1:{}", proxy.addr.port()),
        AGENT_USER,
    )?;

    ctx.step("create the checkpointer's pod and an annotated parent with a Secret and a ConfigMap");
    let me = ctx.create_checkpointer_pod()?;
    let parent = ctx.create_parent_with_data("net-parent")?;
    ctx.expect_api_pod_running(&parent.name)?;
    let static_parent = format!("{}-{NODE_NAME}", parent.name);
    let pod = ctx.id(&parent.name);

    ctx.step("start the agent, its kubeconfig naming the fault proxy; the checkpoint is written");
    let dirs = ctx.dirs("node")?;
    let mut config = ctx.agent_config("agent", &me.name, &dirs);
    config.kubeconfig = Some(kubeconfig);
    let mut agent = ctx.start_agent(&config)?;
    agent.wait_ready()?;
    agent.wait_api_state("synced")?;
    ctx.expect_checkpoint(&dirs, &parent.name, "inactive")?;
    anyhow::ensure!(proxy.accepted() > 0, "the agent did not go through the proxy");

    ctx.step("half-open: the agent's open connections silenced for good; the Secret rotated reaches the checkpoint");
    let silenced = proxy.open();
    proxy.half_open();
    let rotated = "rotated-behind-a-half-open-connection";
    ctx.suite.kubectl.apply(&[secret(
        &ctx.ns,
        &format!("{}-certs", parent.name),
        &[("tls.crt", rotated), ("tls.key", "e2e-private-key")],
    )])?;
    let ((), took) = wait_for("the rotated Secret in the checkpoint", DEFAULT_TIMEOUT, || {
        Ok(if holds_text(&dirs.checkpoint_dir, rotated)? {
            Probe::Ready(())
        } else {
            Probe::Waiting(format!("{} open connections", proxy.open()))
        })
    })?;
    eprintln!(
        "network: half-open: {silenced} connections silenced; the rotated Secret on disk after {:.1} s",
        took.as_secs_f64()
    );

    ctx.step("the parent's containers crash; the API server answers, so nothing is activated");
    ctx.crash(&parent.name)?;
    holds_for("the checkpoint to stay inactive", Duration::from_secs(3), || {
        let inspect = ctx.inspect(&dirs)?;
        Ok(match inspect.get(&pod) {
            Some(c) if c.state == "inactive" => Probe::Ready(()),
            _ => Probe::Waiting(inspect.summary()),
        })
    })?;

    ctx.step(
        "blackhole: the agent sees the API unreachable and activates the checkpoint; the kubelet runs it",
    );
    let fault = Instant::now();
    proxy.set(NetFault::Blackhole);
    let noticed = agent.wait_api_state("unreachable")?;
    ctx.expect_checkpoint(&dirs, &parent.name, "active")?;
    ctx.expect_kubelet_runs(&static_parent, KUBELET_AFTER_OUTAGE_TIMEOUT)?;
    hold_counting(&proxy, "blackhole", fault, noticed)?;

    ctx.step("the network passes again: synced; the parent does not run, so the checkpoint stays active");
    proxy.set(NetFault::Pass);
    let back = agent.wait_api_state("synced")?;
    eprintln!(
        "network: blackhole lifted: synced after {:.1} s",
        back.as_secs_f64()
    );
    let inspect = ctx.inspect(&dirs)?;
    anyhow::ensure!(
        inspect.get(&pod).is_some_and(|c| c.state == "active"),
        "expected {pod} active with the parent not running: {}",
        inspect.summary()
    );

    ctx.step("reset: every connection reset; unreachable, then synced once it passes");
    let fault = Instant::now();
    proxy.set(NetFault::Reset);
    let noticed = agent.wait_api_state("unreachable")?;
    hold_counting(&proxy, "reset", fault, noticed)?;
    proxy.set(NetFault::Pass);
    let back = agent.wait_api_state("synced")?;
    eprintln!("network: resets lifted: synced after {:.1} s", back.as_secs_f64());

    ctx.step("re-create the parent, as its controller would: once it runs, the checkpoint steps aside");
    ctx.recreate_and_expect_inactive(&dirs, &parent)?;
    ctx.expect_kubelet_stopped(&static_parent)?;

    ctx.step("SIGTERM: the agent exits 0");
    let status = agent.stop()?;
    anyhow::ensure!(status.success(), "the agent exited with {status}");
    drop(proxy);
    Ok(())
}

/// Holds the fault for [`HOLD`] once the agent noticed it, and checks the agent's
/// connections through the proxy meanwhile stayed bounded.
fn hold_counting(proxy: &FaultProxy, fault: &str, since: Instant, noticed: Duration) -> anyhow::Result<()> {
    let accepted = proxy.accepted();
    let mut most_open = proxy.open();
    let until = Instant::now() + HOLD;
    while Instant::now() < until {
        most_open = most_open.max(proxy.open());
        std::thread::sleep(Duration::from_millis(100));
    }
    let new = proxy.accepted() - accepted;
    let per_sec = new as f64 / HOLD.as_secs_f64();
    eprintln!(
        "network: {fault}: unreachable after {:.1} s; then {new} connections in {} s, at most {most_open} open ({:.0} s in all)",
        noticed.as_secs_f64(),
        HOLD.as_secs(),
        since.elapsed().as_secs_f64()
    );
    anyhow::ensure!(
        per_sec <= MAX_CONNECTIONS_PER_SEC,
        "{fault}: {new} new connections in {} s",
        HOLD.as_secs()
    );
    anyhow::ensure!(
        most_open <= MAX_OPEN,
        "{fault}: {most_open} connections open at once"
    );
    Ok(())
}

/// Whether a regular file below `dir` holds `text` (symlinks not followed).
fn holds_text(dir: &Path, text: &str) -> anyhow::Result<bool> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(false);
    };
    for entry in entries {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() && holds_text(&entry.path(), text)? {
            return Ok(true);
        }
        if kind.is_file()
            && std::fs::read(entry.path())?
                .windows(text.len())
                .any(|w| w == text.as_bytes())
        {
            return Ok(true);
        }
    }
    Ok(false)
}
