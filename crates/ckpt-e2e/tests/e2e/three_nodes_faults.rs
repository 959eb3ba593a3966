//! Issue 38, scenarios 2 and 3, on the self-hosted control plane of three nodes (see
//! [`ensure_self_hosted`]): a rolling power cut, one node at a time, and a partition of one
//! node from the others, which is also power-cycled while cut off. Both run in the longer
//! mode (`E2E_LONG=1`).
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
use ckpt_e2e::e2e_env::cri::CriClient;
use ckpt_e2e::process::random_hex;
use ckpt_e2e::progress::human_duration;
use ckpt_e2e::self_hosted::SelfHosted;
use serde_json::{Value, json};

use crate::failover::FailoverWriter;
use crate::self_hosted::{patch_apiserver, running_apiservers};
use crate::three_nodes::ClusterRun;
use crate::three_nodes_cut::{
    SAMPLE_EVERY, TIMEOUT, active_apiserver, active_control_plane, ensure_self_hosted, inspect_node,
    is_apiserver, parents_ready, set_aside,
};
use crate::three_nodes_upgrades::{env_of, wait_known_good, wait_rolled_out};

/// The environment variable the partition's upgrade sets (kube-apiserver ignores it).
const PARTITION_ENV: &str = "E2E_PARTITION";
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
/// API server stops serving. The other two serve throughout, and their agents activate
/// nothing.
///
/// First kube-apiserver is upgraded (an environment variable), so that node-2 holds two
/// known-good revisions of it: the set-aside rule needs one to fall back to, else a
/// crash-looping checkpoint simply runs on.
///
/// On node-2 the agent follows the contract (DESIGN §3.3): it replaces only a parent that
/// does not run. kube-apiserver without quorum keeps running, unready, so first the agent
/// is watched while that lasts. Then node-2 loses power while still cut off, as a node does
/// when its switch is dead and someone power-cycles it: after the boot no parent runs (the
/// kubelet cannot reach an API to learn its pods), so the agent activates the newest
/// kube-apiserver revision, which crash-loops without quorum. The agent sets it aside and
/// runs the previous one, which crash-loops alike: the restarts are the environment's, and
/// the newest runs again with its mark. With the link back, everything is as before: the API
/// server serves, no checkpoint is active, and every checkpoint's known-good mark is as it
/// was, none suspended.
pub(crate) fn partition(run: &mut ClusterRun) -> anyhow::Result<()> {
    const VICTIM: usize = 1;
    let self_hosted = ensure_self_hosted(run)?;
    let name = run.nodes[VICTIM].name().to_owned();
    // The revision the upgrade replaces must be known-good too: right after the pivot (the
    // scenario run alone) its pods have not been Ready for a minute yet.
    wait_known_good(run, |_| true)?;
    let value = random_hex(4)?;
    run.progress.say(&format!(
        "kube-apiserver upgraded ({PARTITION_ENV}={value}): {name} is to hold two known-good revisions of it"
    ));
    patch_apiserver(
        &run.kubectl,
        &json!([{
            "op": "add",
            "path": "/spec/template/spec/containers/0/env/-",
            "value": { "name": PARTITION_ENV, "value": value },
        }]),
    )?;
    let upgraded = |pod: &Value| env_of(pod, PARTITION_ENV).as_deref() == Some(value.as_str());
    wait_rolled_out(run, &self_hosted, upgraded)?;
    wait_known_good(run, upgraded)?;
    run.progress
        .say(&format!("{name}'s checkpoints known-good before the partition"));
    let ((), _) = ckpt_e2e::wait::wait_for(&format!("{name}'s checkpoints known-good"), TIMEOUT, || {
        let report = inspect_node(&run.nodes[VICTIM])?;
        let control_plane: Vec<_> = report
            .checkpoints
            .iter()
            .filter(|c| c.pod.contains("kube-"))
            .collect();
        let apiservers = (control_plane.iter()).filter(|c| is_apiserver(&c.pod)).count();
        Ok(if apiservers >= 2 && control_plane.iter().all(|c| c.known_good) {
            ckpt_e2e::wait::Probe::Ready(())
        } else {
            ckpt_e2e::wait::Probe::Waiting(report.summary())
        })
    })?;
    let before = inspect_node(&run.nodes[VICTIM])?;
    let writer = FailoverWriter::start(&run.kubectl, &self_hosted)?;
    let link = run.nodes[VICTIM].network().host_link.clone();
    let lan = run.plane.lan().context("the plane has no LAN")?.netns.clone();
    run.progress
        .say(&format!("{name} partitioned: its LAN link {link} down"));
    set_link(&lan, &link, "down")?;
    let outcome = hold_partition(run, VICTIM);
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
/// the node) and watches its agent for `PARENT_WATCHED` while the parent runs unready (if
/// the parent stops, the agent may activate: that is the contract too, and what follows
/// the power cut then continues from there); then cuts the node's power and waits until
/// its agent has activated the newest kube-apiserver revision, set it aside and run it
/// again (see [`partition`]). Nothing may be active elsewhere at any sample. Returns how
/// long the partition lasted.
fn hold_partition(run: &mut ClusterRun, victim: usize) -> anyhow::Result<Duration> {
    /// How long the agent is watched with its parent running without quorum.
    const PARENT_WATCHED: Duration = Duration::from_secs(30);
    /// How long a parent that does not run may go without its checkpoint activated (the
    /// agent activates within a second; DESIGN §5).
    const ACTIVATES_WITHIN: Duration = Duration::from_secs(10);
    /// How long the two revisions get to crash-loop three times each (the kubelet's back-off
    /// between restarts grows to 40 s and more).
    const RECOGNISED_WITHIN: Duration = Duration::from_secs(8 * 60);
    let name = run.nodes[victim].name().to_owned();
    let ca = run.plane.ca_cert();
    let started = Instant::now();

    // Phase 1: the partition alone.
    let mut stopped_serving = None;
    let mut parent = ParentSeen::default();
    let mut activated = None;
    let cri = CriClient::new(&run.nodes[victim].containerd_socket().to_string_lossy());
    let watched = watch_the_others(run, victim, TIMEOUT, |run| {
        let node = &run.nodes[victim];
        if stopped_serving.is_none() && local_readyz(node, &ca) != 200 {
            stopped_serving = Some(Instant::now());
        }
        parent.sample(&cri, &name);
        let report = inspect_node(node)?;
        if activated.is_none() && !active_apiserver(&report).is_empty() {
            activated = Some(started.elapsed());
        }
        // The other half of the contract: a parent that does not run, with the API
        // unreachable, is replaced within the agent's poll.
        anyhow::ensure!(
            activated.is_some() || parent.not_running_for() < ACTIVATES_WITHIN,
            "partitioned {name}: its kube-apiserver parent has not run for {} and its agent activated nothing",
            human_duration(parent.not_running_for())
        );
        Ok(stopped_serving.is_some_and(|at| at.elapsed() >= PARENT_WATCHED))
    })?;
    let stopped_serving = stopped_serving.map(|at| at - started);
    anyhow::ensure!(
        watched,
        "partitioned {name}: its API server stopped serving after {stopped_serving:?} (needed within {})",
        human_duration(TIMEOUT)
    );
    run.progress.say(&format!(
        "partitioned {name}: its API server stopped serving after {}; for {} after that, {}, and {}",
        human_duration(stopped_serving.unwrap_or_default()),
        human_duration(PARENT_WATCHED),
        parent.summary(),
        match activated {
            Some(at) => format!(
                "its agent activated the kube-apiserver checkpoint after {}",
                human_duration(at)
            ),
            None => "its agent activated nothing (it replaces only a parent that does not run)".to_owned(),
        }
    ));

    // Phase 2: a power cut while cut off. After the boot no parent runs.
    run.progress.say(&format!("{name} loses power while cut off"));
    let cut = Instant::now();
    run.nodes[victim].reboot()?;
    let mut activated = None;
    let mut first_set_aside: Option<(Duration, Vec<String>)> = None;
    let mut ran_again = None;
    let reached = watch_the_others(run, victim, RECOGNISED_WITHIN, |run| {
        let report = inspect_node(&run.nodes[victim])?;
        if activated.is_none() && !active_apiserver(&report).is_empty() {
            activated = Some(cut.elapsed());
        }
        let suspended = set_aside(&report);
        if first_set_aside.is_none() && !suspended.is_empty() {
            let suspended = suspended.iter().map(|pod| (*pod).to_owned()).collect();
            first_set_aside = Some((cut.elapsed(), suspended));
        }
        // The restarts recognised as the environment's: no mark suspended any more, and the
        // newest revision is the one running.
        let newest_runs = report.checkpoints.iter().any(|c| {
            is_apiserver(&c.pod) && c.state.starts_with("active") && c.newest_revision == Some(true)
        });
        if first_set_aside.is_some() && suspended.is_empty() && newest_runs {
            ran_again = Some(cut.elapsed());
        }
        Ok(ran_again.is_some())
    })?;
    anyhow::ensure!(
        reached,
        "{name}, rebooted while cut off: within {} its agent activated the kube-apiserver checkpoint after {activated:?}, set {first_set_aside:?} aside, and did not run the newest revision again with its mark (the restarts are the quorum's, not the revision's)",
        human_duration(RECOGNISED_WITHIN)
    );
    let (set_aside_at, suspended) = first_set_aside.unwrap_or_default();
    run.progress.say(&format!(
        "{name}, rebooted while cut off: the agent activated the newest kube-apiserver revision {} after the cut; it crash-looped without quorum and was set aside after {} ({}); the previous one crash-looped alike, so after {} the newest ran again, its mark held",
        human_duration(activated.unwrap_or_default()),
        human_duration(set_aside_at),
        suspended.join(", "),
        human_duration(ran_again.unwrap_or_default())
    ));
    Ok(started.elapsed())
}

/// What the samples of a node's runtime showed of its kube-apiserver parent (the DaemonSet's
/// pod; a checkpoint's static pod is named after it with the node's name appended).
#[derive(Default)]
struct ParentSeen {
    running: usize,
    not_running: usize,
    unknown: usize,
    /// Since when the samples have shown it not running, without a break.
    not_running_since: Option<Instant>,
}

impl ParentSeen {
    fn sample(&mut self, cri: &CriClient, node: &str) {
        match running_apiservers(cri) {
            Some(pods) if pods.iter().any(|pod| !pod.ends_with(&format!("-{node}"))) => {
                self.running += 1;
                self.not_running_since = None;
            }
            Some(_) => {
                self.not_running += 1;
                self.not_running_since.get_or_insert_with(Instant::now);
            }
            None => self.unknown += 1,
        }
    }

    /// How long the samples have shown the parent not running, without a break.
    fn not_running_for(&self) -> Duration {
        self.not_running_since
            .map_or(Duration::ZERO, |since| since.elapsed())
    }

    fn summary(&self) -> String {
        format!(
            "its kube-apiserver parent ran in {} of {} samples of its runtime ({} unanswered)",
            self.running,
            self.running + self.not_running + self.unknown,
            self.unknown
        )
    }
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
