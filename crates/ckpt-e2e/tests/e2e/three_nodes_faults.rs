//! Issue 38, scenarios 2 and 3, on the self-hosted control plane of three nodes (see
//! [`ensure_self_hosted`]): a rolling power cut, one node at a time, and a partition of one
//! node from the others. Both run in the longer mode (`E2E_LONG=1`).
//!
//! Throughout, a client writes through the three node addresses, failing over from one to the
//! next ([`FailoverWriter`]), and the agents of the nodes not cut are sampled: their API server
//! never went away, so none of them may activate anything.

use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::Context;
use ckpt_e2e::command::run_command;
use ckpt_e2e::e2e_env::RealNode;
use ckpt_e2e::progress::human_duration;
use ckpt_e2e::self_hosted::SelfHosted;

use crate::failover::FailoverWriter;
use crate::three_nodes::ClusterRun;
use crate::three_nodes_cut::{
    SAMPLE_EVERY, TIMEOUT, active_control_plane, ensure_self_hosted, inspect_node, parents_ready, set_aside,
};

/// How long the cluster runs undisturbed between two nodes' cuts.
const PAUSE: Duration = Duration::from_secs(10);

/// Scenario 2: node-1, node-2 and node-3 lose power one after the other, each once the
/// cluster is whole again and a pause has passed. The cut node's agent activates its
/// checkpoints and retires them once the parents are back; no other node's agent activates
/// anything; the failover client never fails for longer than [`FAILOVER_BOUND`](crate::failover::FAILOVER_BOUND).
pub(crate) fn rolling_power_cut(run: &mut ClusterRun) -> anyhow::Result<()> {
    let self_hosted = ensure_self_hosted(run)?;
    let writer = FailoverWriter::start(&run.kubectl, &self_hosted)?;
    let mut outcome = Ok(());
    for victim in 0..run.nodes.len() {
        outcome = watch_the_others(run, victim, PAUSE, |_| Ok(false))
            .and_then(|_| cut_one(run, &self_hosted, victim));
        if outcome.is_err() {
            break;
        }
    }
    let writes = writer.stop();
    outcome?;
    let writes = writes?;
    run.progress
        .say(&format!("the failover client: {}", writes.summary()));
    writes.ensure_within_bound("during the rolling cut")?;
    Ok(())
}

/// One node's power cut within the rolling one: timed until its API server serves, its
/// checkpoints were active and are retired, and every parent is Ready.
fn cut_one(run: &mut ClusterRun, self_hosted: &SelfHosted, victim: usize) -> anyhow::Result<()> {
    let name = run.nodes[victim].name().to_owned();
    let url = self_hosted
        .apis()
        .nth(victim)
        .context("no API server for the node")?
        .to_owned();
    run.progress
        .say(&format!("{name} loses power; the others run on"));
    let cut = Instant::now();
    run.nodes[victim].reboot()?;
    let mut api_back = None;
    let mut activated = false;
    let back = watch_the_others(run, victim, TIMEOUT, |run| {
        if api_back.is_none() && self_hosted.readyz_of(&url) == 200 {
            api_back = Some(cut.elapsed());
        }
        let active = active_control_plane(&inspect_node(&run.nodes[victim])?);
        activated |= !active.is_empty();
        Ok(api_back.is_some()
            && activated
            && active.is_empty()
            && parents_ready(&run.kubectl, run.nodes.len())?)
    })?;
    anyhow::ensure!(
        back,
        "{name} was not back within {}: its API {api_back:?}, its checkpoints activated: {activated}",
        human_duration(TIMEOUT)
    );
    run.progress.say(&format!(
        "{name}: its API server serving {} after the cut, its checkpoints activated and retired, every parent Ready {}",
        human_duration(api_back.unwrap_or_default()),
        human_duration(cut.elapsed())
    ));
    Ok(())
}

/// Samples every node but `except` for `until` (then returns `false`), or until `done`
/// says so (`true`): no control-plane checkpoint may be active on any of them.
fn watch_the_others(
    run: &ClusterRun,
    except: usize,
    until: Duration,
    mut done: impl FnMut(&ClusterRun) -> anyhow::Result<bool>,
) -> anyhow::Result<bool> {
    let started = Instant::now();
    while started.elapsed() < until {
        let round = Instant::now();
        for (index, node) in run.nodes.iter().enumerate() {
            if index == except {
                continue;
            }
            let active = active_control_plane(&inspect_node(node)?);
            anyhow::ensure!(
                active.is_empty(),
                "{}'s agent activated {active:?} while {} was the one cut off (its own API server never went away)",
                node.name(),
                run.nodes[except].name()
            );
        }
        if done(run)? {
            return Ok(true);
        }
        thread::sleep(SAMPLE_EVERY.saturating_sub(round.elapsed()));
    }
    Ok(false)
}

/// Scenario 3: node-2's link to the LAN goes down. Its etcd member loses the others, so its
/// API server stops serving; its agent activates the local kube-apiserver checkpoint (which
/// cannot serve either) and sets no revision aside. The other two serve throughout. With the
/// link back, everything is as before: the API server serves, no checkpoint is active, and
/// every checkpoint's known-good mark is as it was.
pub(crate) fn partition(run: &mut ClusterRun) -> anyhow::Result<()> {
    const VICTIM: usize = 1;
    /// How long the partition lasts once the checkpoint is active: long enough for a
    /// checkpoint that cannot serve to crash-loop, which is when a revision would be set aside.
    const HELD: Duration = Duration::from_secs(60);
    let self_hosted = ensure_self_hosted(run)?;
    let name = run.nodes[VICTIM].name().to_owned();
    run.progress
        .say(&format!("{name}'s checkpoints known-good before the partition"));
    let ((), _) = ckpt_e2e::wait::wait_for(&format!("{name}'s checkpoints known-good"), TIMEOUT, || {
        let report = inspect_node(&run.nodes[VICTIM])?;
        let control_plane: Vec<_> = report
            .checkpoints
            .iter()
            .filter(|c| c.pod.contains("kube-"))
            .collect();
        Ok(
            if !control_plane.is_empty() && control_plane.iter().all(|c| c.known_good) {
                ckpt_e2e::wait::Probe::Ready(())
            } else {
                ckpt_e2e::wait::Probe::Waiting(report.summary())
            },
        )
    })?;
    let before = inspect_node(&run.nodes[VICTIM])?;
    let writer = FailoverWriter::start(&run.kubectl, &self_hosted)?;
    let link = run.nodes[VICTIM].network().host_link.clone();
    let lan = run.plane.lan().context("the plane has no LAN")?.netns.clone();
    run.progress
        .say(&format!("{name} partitioned: its LAN link {link} down"));
    set_link(&lan, &link, "down")?;
    let outcome = hold_partition(run, VICTIM, HELD);
    set_link(&lan, &link, "up")?;
    let partitioned = outcome?;
    run.progress.say(&format!(
        "{name}'s link up again after {}",
        human_duration(partitioned)
    ));
    let url = self_hosted
        .apis()
        .nth(VICTIM)
        .context("no API server for the node")?
        .to_owned();
    let healed = Instant::now();
    let back = watch_the_others(run, VICTIM, TIMEOUT, |run| {
        let report = inspect_node(&run.nodes[VICTIM])?;
        Ok(self_hosted.readyz_of(&url) == 200
            && active_control_plane(&report).is_empty()
            && parents_ready(&run.kubectl, run.nodes.len())?)
    })?;
    let writes = writer.stop()?;
    anyhow::ensure!(
        back,
        "{name} was not whole again within {} of the link's return",
        human_duration(TIMEOUT)
    );
    run.progress.say(&format!(
        "{name} whole again {} after the link's return; the failover client: {}",
        human_duration(healed.elapsed()),
        writes.summary()
    ));
    let after = inspect_node(&run.nodes[VICTIM])?;
    for checkpoint in &before.checkpoints {
        let now = after
            .get(&checkpoint.pod)
            .with_context(|| format!("{}'s checkpoint of {} is gone", name, checkpoint.pod))?;
        anyhow::ensure!(
            now.known_good == checkpoint.known_good && now.known_good_suspended_since.is_none(),
            "{}'s checkpoint of {}: known-good {} before, {} after (suspended since {:?})",
            name,
            checkpoint.pod,
            checkpoint.known_good,
            now.known_good,
            now.known_good_suspended_since
        );
    }
    writes.ensure_within_bound("during the partition")?;
    Ok(())
}

/// While `victim` is cut off: waits until its API server stops serving (asked from inside
/// the node) and its agent has activated its kube-apiserver checkpoint, then holds for
/// `held`, checking that no revision is set aside there and nothing activates elsewhere.
/// Returns how long the partition lasted.
fn hold_partition(run: &ClusterRun, victim: usize, held: Duration) -> anyhow::Result<Duration> {
    let node = &run.nodes[victim];
    let name = node.name();
    let started = Instant::now();
    let mut stopped_serving = None;
    let mut activated = None;
    let reached = watch_the_others(run, victim, TIMEOUT, |run| {
        if stopped_serving.is_none() && local_readyz(node, &run.plane.ca_cert()) != 200 {
            stopped_serving = Some(started.elapsed());
        }
        let report = inspect_node(node)?;
        let suspended = set_aside(&report);
        anyhow::ensure!(
            suspended.is_empty(),
            "{name}'s agent set revisions aside while cut off from the quorum: {suspended:?}"
        );
        if activated.is_none() && !active_control_plane(&report).is_empty() {
            activated = Some(started.elapsed());
        }
        Ok(activated.is_some_and(|at| started.elapsed() >= at + held) && stopped_serving.is_some())
    })?;
    anyhow::ensure!(
        reached,
        "partitioned {name}: its API server stopped serving after {stopped_serving:?}, its agent activated after {activated:?} (both needed within {})",
        human_duration(TIMEOUT)
    );
    run.progress.say(&format!(
        "partitioned {name}: its API server stopped serving after {}, its agent activated the checkpoint after {}, nothing set aside for {}",
        human_duration(stopped_serving.unwrap_or_default()),
        human_duration(activated.unwrap_or_default()),
        human_duration(held)
    ));
    Ok(started.elapsed())
}

/// `GET /readyz` of the node's own API server, from inside the node (0: no answer).
fn local_readyz(node: &RealNode, ca: &std::path::Path) -> u16 {
    let mut curl = node.command("curl");
    curl.args([
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "--max-time",
        "2",
        "--cacert",
    ])
    .arg(ca)
    .arg("https://127.0.0.1:6443/readyz");
    run_command(&mut curl)
        .ok()
        .and_then(|code| code.trim().parse().ok())
        .unwrap_or(0)
}

fn set_link(netns: &str, link: &str, state: &str) -> anyhow::Result<()> {
    run_command(Command::new("ip").args(["-n", netns, "link", "set", link, state]))
        .map(drop)
        .with_context(|| format!("cannot set {link} {state}"))
}
