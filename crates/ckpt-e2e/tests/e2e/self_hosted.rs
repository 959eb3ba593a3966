//! The reason pod-checkpointer exists (issue 17): a self-hosted control plane on the real
//! node comes back after the node loses power. The plane's host API server, controller-
//! manager and scheduler bootstrap kube-apiserver (a DaemonSet), kube-controller-manager
//! and kube-scheduler (Deployments) on the node and stop ([`SelfHosted::install`]); the agent
//! is deployed through the self-hosted API server and checkpoints all three. Then the node
//! loses power (every process of the node SIGKILLed, the disk kept; etcd is an external
//! host process and is not cut) and is timed on its way back: the static copy of the agent,
//! the checkpoints active, the API serving, a marker written before the cut read back, the
//! parents running and every checkpoint retired. After the cuts, every parent proves its
//! checkpoint's content (Ready for a minute: known-good in `inspect`).
//!
//! Runs last among the real-node scenarios: after the pivot the plane's own API server is
//! gone for good, and every other scenario needs it.

use std::time::{Duration, Instant};

use anyhow::Context;
use ckpt_e2e::e2e_env::cri::{ContainerState, CriClient};
use ckpt_e2e::e2e_env::{self, NODE_NAME};
use ckpt_e2e::harness::agent::Inspect;
use ckpt_e2e::harness::kubectl::{Kubectl, pod_running};
use ckpt_e2e::harness::lock::{Holding, lock_holder};
use ckpt_e2e::image::BUSYBOX_IMAGE;
use ckpt_e2e::process::random_hex;
use ckpt_e2e::progress::human_duration;
use ckpt_e2e::self_hosted::objects::{APISERVER, APISERVER_GRACE_SECONDS, CONTROLLER_MANAGER, SCHEDULER};
use ckpt_e2e::self_hosted::timeline::{Sampler, first_at, longest_lapse, time_holding};
use ckpt_e2e::self_hosted::{SelfHosted, pods_of};
use ckpt_e2e::wait::{Probe, wait_for, waiting_on_error};
use serde_json::{Value, json};

use crate::real_node::NodeRun;
use crate::real_node_seed::{
    NS, deploy_with, host, is_mirror, label_control_plane, last_log_line, lock_file, log_lines, name_of,
    pods_named_like, reset, restart_count, state_of, upgrade_image, wait_agent_pair, wait_health,
    wait_inspect,
};

const COMPONENTS: [&str; 3] = [APISERVER, CONTROLLER_MANAGER, SCHEDULER];
/// Real components start after a power cut, some after a crash-loop back-off: generous.
const TIMEOUT: Duration = Duration::from_secs(240);
const LOCK_TAKEN: &str = "lock taken: this copy is active";
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// How long the parent API server must serve without a failed `/readyz` to count as back.
const SETTLED: Duration = Duration::from_secs(5);

/// The pivot to a self-hosted control plane, the agent deployed through it, one power cut.
pub(crate) fn power_cut(run: &mut NodeRun) -> anyhow::Result<()> {
    let progress = run.progress;
    reset(run)?;
    label_control_plane(run)?;
    let bins = e2e_env::cached_bins(e2e_env::Release::from_env()?)?;
    let self_hosted = SelfHosted::install(&mut run.plane, std::slice::from_mut(&mut run.node), &bins)?;
    // From here on every helper talks to the node's API server.
    run.kubectl = self_hosted.kubectl().clone();
    check_scheduling(run)?;
    progress.say("a new Deployment's pod is scheduled and started by the self-hosted plane");

    deploy_with(
        run,
        self_hosted.kubeconfig(),
        "grace-period",
        &["--handoff-timeout", HANDOFF_TIMEOUT],
    )?;
    let (c1, _) = wait_agent_pair(run, "C1 and its static copy C2 running")?;
    let parents = wait_running_parents(run)?;
    let report = wait_inspect(
        run,
        "the control plane's checkpoints inactive, C1's active",
        |i| {
            parents.iter().all(|p| state_of(i, p) == Some("inactive"))
                && state_of(i, &c1).is_some_and(|s| s.starts_with("active"))
        },
    )?;
    progress.say(&format!("checkpoints: {}", report.summary()));

    // CI: the variants, folded into two cuts; the longer mode adds a series of plain ones;
    // the demo shows one plain cut.
    let kinds: Vec<Cut> = if crate::demo_mode() {
        vec![Cut::Plain]
    } else {
        let plain = if crate::long_mode() { LONG_PLAIN_CUTS } else { 0 };
        std::iter::repeat_n(Cut::Plain, plain)
            .chain([Cut::UpgradedAndRevoked, Cut::DuringRecovery])
            .collect()
    };
    let mut cuts = Vec::new();
    for (n, kind) in kinds.into_iter().enumerate() {
        cuts.push(power_cut_once(run, &self_hosted, n + 1, kind)?);
    }
    // Each parent ran Ready for a minute with the content on disk, after the cuts (each cut
    // breaks the streak; the demo does not wait for it).
    if !crate::demo_mode() {
        expect_known_good(run, &parents)?;
        let fixed = bad_upgrade_then_power_cut(run, &self_hosted, &parents[0])?;
        known_good_fails_after_the_cut(run, &self_hosted, &fixed)?;
    }
    report_cuts(run, &cuts)?;
    if crate::demo_mode() {
        for cut in &cuts {
            narrate(cut);
        }
    }
    Ok(())
}

/// `--handoff-timeout` of every deploy here: how long a kube-apiserver with an unproven spec
/// has to become Ready (short: the bad upgrade waits it out at most twice).
const HANDOFF_TIMEOUT: &str = "30s";
/// The flag the bad upgrade adds: kube-apiserver exits at once on an unknown flag.
const BAD_FLAG: &str = "--no-such-flag=true";

/// Issue 21: kube-apiserver's DaemonSet is upgraded to a spec that crash-loops; the known-
/// good checkpoint keeps the API serving, through a power cut; rolling the DaemonSet back
/// hands the node over to the new parent once it is Ready, with the API gap measured. The
/// pods bind beside their checkpoint (`handoff: when-ready`): the bad pod never gets the
/// node, and the checkpoint retires only once the rolled-back pod is Ready.
/// `good` is the known-good kube-apiserver pod: the DaemonSet's pod through the cuts, whose
/// container may be between two starts at this instant.
fn bad_upgrade_then_power_cut(
    run: &mut NodeRun,
    self_hosted: &SelfHosted,
    good: &str,
) -> anyhow::Result<String> {
    let progress = run.progress;
    let good = good.to_owned();
    let ds = run
        .kubectl
        .get("daemonset", NS, APISERVER)?
        .context("no kube-apiserver DaemonSet")?;
    let args = ds["spec"]["template"]["spec"]["containers"][0]["command"]
        .as_array()
        .map_or(0, Vec::len);
    progress.say(&format!(
        "kube-apiserver's DaemonSet upgraded with {BAD_FLAG}: its new pod crash-loops"
    ));
    let patch = json!([{
        "op": "add",
        "path": "/spec/template/spec/containers/0/command/-",
        "value": BAD_FLAG,
    }]);
    patch_apiserver(&run.kubectl, &patch)?;
    let good_id = format!("{NS}/{good}");
    let (bad, _) = wait_for(
        "the bad pod checkpointed beside the known-good one, which serves",
        TIMEOUT,
        || {
            waiting_on_error((|| {
                let report = crate::real_node_seed::inspect_node(run)?;
                let known_good = report.get(&good_id);
                let newest =
                    (report.checkpoints.iter()).find(|c| c.pod != good_id && c.newest_revision == Some(true));
                let serving =
                    known_good.is_some_and(|c| c.state == "active" && c.runs_if_api_lost == Some(true));
                // The upgrade is bad: the new pod's container has exited at least once.
                let restarted = |name: &str| -> anyhow::Result<bool> {
                    let name = name.strip_prefix(&format!("{NS}/")).unwrap_or(name);
                    Ok(run
                        .kubectl
                        .get("pod", NS, name)?
                        .is_some_and(|p| restart_count(&p) >= 1))
                };
                Ok(match newest {
                    Some(newest) if serving && self_hosted.readyz() == 200 && restarted(&newest.pod)? => {
                        Probe::Ready(newest.pod.clone())
                    }
                    _ => Probe::Waiting(report.summary()),
                })
            })())
        },
    )?;
    let bad = bad.strip_prefix(&format!("{NS}/")).unwrap_or(&bad).to_owned();
    progress.say(&format!(
        "{bad} crash-loops; the known-good checkpoint of {good} serves the API"
    ));
    wait_api(self_hosted, "the API served by the known-good checkpoint")?;
    // From here to the rollback the known-good checkpoint must never step aside, through
    // the cut too (the node's disk keeps its manifest). Each start of the bad pod's
    // container reads Ready for a probe period: its probe is answered by the checkpoint on
    // the port they share; the agent must not take that for the pod's own readiness.
    let known_good_active = {
        let manifests = run.node.manifests_dir();
        Sampler::start(SAMPLE_EVERY, move || apiserver_checkpoint_active(&manifests))
    };

    progress.say("power cut with the bad pod crash-looping");
    let cut = Instant::now();
    run.node.reboot()?;
    wait_api(self_hosted, "the API back after the cut")?;
    let api_ready = cut.elapsed();
    wait_for("the known-good checkpoint active and serving", TIMEOUT, || {
        waiting_on_error((|| {
            let report = crate::real_node_seed::inspect_node(run)?;
            let active = report.get(&good_id).is_some_and(|c| c.state == "active");
            Ok(if active && self_hosted.readyz() == 200 {
                Probe::Ready(())
            } else {
                Probe::Waiting(report.summary())
            })
        })())
    })?;
    progress.say(&format!(
        "the known-good kube-apiserver serves {} after the cut",
        human_duration(api_ready)
    ));
    // Two more starts of the bad pod after the cut, each a Ready flash, before the rollback
    // (its count may start again from 0 after the cut: the runtime lost its containers).
    let restarts = |run: &NodeRun| -> anyhow::Result<Option<u64>> {
        Ok(run.kubectl.get("pod", NS, &bad)?.as_ref().map(restart_count))
    };
    let mut base = restarts(run)?.unwrap_or(0);
    let (_, _) = wait_for("the bad pod to start twice more after the cut", TIMEOUT, || {
        let now = restarts(run)?;
        if let Some(n) = now.filter(|n| *n < base) {
            base = n;
        }
        Ok(match now {
            Some(n) if n >= base + 2 => Probe::Ready(()),
            n => Probe::Waiting(format!("its restarts: {n:?}, from {base}")),
        })
    })?;
    let samples = known_good_active.stop();
    let stepped_aside = samples.iter().filter(|(_, active)| !*active).count();
    anyhow::ensure!(
        stepped_aside == 0,
        "the known-good checkpoint stepped aside for the crash-looping {bad} ({stepped_aside} of {} samples without its manifest)",
        samples.len()
    );
    let watched = (samples.first().zip(samples.last())).map_or(Duration::ZERO, |(a, b)| b.0 - a.0);
    progress.say(&format!(
        "the known-good checkpoint never stepped aside for {bad}: {} samples over {}, the cut and its restarts ({:?} now) included",
        samples.len(),
        human_duration(watched),
        restarts(run)?
    ));

    progress.say("the DaemonSet rolled back: the node is handed over to its new pod");
    let readyz = {
        let self_hosted = self_hosted.clone();
        Sampler::start(SAMPLE_EVERY, move || self_hosted.readyz())
    };
    let rollback = Instant::now();
    let patch = json!([
        { "op": "test", "path": format!("/spec/template/spec/containers/0/command/{args}"), "value": BAD_FLAG },
        { "op": "remove", "path": format!("/spec/template/spec/containers/0/command/{args}") },
    ]);
    patch_apiserver(&run.kubectl, &patch)?;
    let fixed = wait_new_apiserver_ready(run, "the rolled-back pod Ready", &[&good, &bad])?;
    wait_inspect(run, "the known-good checkpoint retired", |i| {
        i.get(&good_id).is_some_and(|c| c.state == "inactive")
    })?;
    wait_api_settled(self_hosted, "the API")?;
    let settled = Instant::now();
    let samples = readyz.stop();
    let gap = longest_lapse(&samples, rollback, settled, |s| *s == 200);
    let handed_over = rollback.elapsed();
    // No handoff at all (`when-ready`): neither pod ever had the node alone, however
    // often the agent saw it running (before the cut, after it, from either copy).
    for pod in [&bad, &fixed] {
        let handoffs: Vec<String> = (events_of(run, pod)?.iter())
            .filter_map(|e| {
                e["reason"]
                    .as_str()
                    .filter(|r| r.starts_with("Handoff"))
                    .map(str::to_owned)
            })
            .collect();
        anyhow::ensure!(
            handoffs.is_empty(),
            "{NS}/{pod} was handed the node: {handoffs:?}"
        );
    }
    progress.say(&format!(
        "handed over to {fixed} {} after the rollback, once it was Ready; the API's longest gap: {}; the bad pod never had the node",
        human_duration(handed_over),
        human_duration(gap)
    ));
    let line = json!({
        "scenario": "bad upgrade, power cut, rollback",
        "API ready after the cut": api_ready.as_secs_f64(),
        "handed over after the rollback": handed_over.as_secs_f64(),
        "API gap in the handoff": gap.as_secs_f64(),
    });
    append_lines("self-hosted-handoffs.jsonl", &[line])?;
    Ok(fixed)
}

/// The node dir of the audit policy the good upgrade below names.
const AUDIT_DIR: &str = "/etc/kubernetes/e2e-audit";
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: None\n";

/// Issue 21, a known-good revision that fails after the cut: kube-apiserver's DaemonSet is
/// upgraded to a spec that names an audit policy file on the node's disk; it proves itself
/// (a minute Ready: known-good). The file is removed, then the power is cut: the newest
/// known-good revision, activated, crash-loops (kube-apiserver exits without its policy);
/// after three restarts the agent sets it aside and the previous known-good revision
/// (`previous`, the pod the rollback made) brings the API back. Rolling the DaemonSet back
/// hands the node over to a new pod.
fn known_good_fails_after_the_cut(
    run: &mut NodeRun,
    self_hosted: &SelfHosted,
    previous: &str,
) -> anyhow::Result<()> {
    let progress = run.progress;
    let ds = run
        .kubectl
        .get("daemonset", NS, APISERVER)?
        .context("no kube-apiserver DaemonSet")?;
    let spec = &ds["spec"]["template"]["spec"];
    let len = |v: &Value| v.as_array().map_or(0, Vec::len);
    let (args, volumes, mounts) = (
        len(&spec["containers"][0]["command"]),
        len(&spec["volumes"]),
        len(&spec["containers"][0]["volumeMounts"]),
    );
    expect_known_good(run, &[previous.to_owned()])?;
    let audit_dir = crate::real_node_seed::host(run, AUDIT_DIR)?;
    let policy = audit_dir.join("policy.yaml");
    std::fs::create_dir_all(&audit_dir)?;
    std::fs::write(&policy, AUDIT_POLICY)?;
    let flag = format!("--audit-policy-file={AUDIT_DIR}/policy.yaml");
    progress.say(&format!(
        "kube-apiserver's DaemonSet upgraded with {flag} (the file on the node's disk)"
    ));
    let patch = json!([
        { "op": "add", "path": "/spec/template/spec/containers/0/command/-", "value": flag },
        { "op": "add", "path": "/spec/template/spec/volumes/-",
          "value": { "name": "audit", "hostPath": { "path": AUDIT_DIR, "type": "Directory" } } },
        { "op": "add", "path": "/spec/template/spec/containers/0/volumeMounts/-",
          "value": { "name": "audit", "mountPath": AUDIT_DIR, "readOnly": true } },
    ]);
    patch_apiserver(&run.kubectl, &patch)?;
    let upgraded = wait_new_apiserver_ready(run, "the upgraded pod Ready", &[previous])?;
    expect_known_good(run, &[upgraded.clone(), previous.to_owned()])?;
    wait_api_settled(self_hosted, &upgraded)?;

    progress.say(&format!(
        "the audit policy file removed from the node's disk; power cut with {upgraded} running"
    ));
    std::fs::remove_file(&policy)?;
    let cut = Instant::now();
    run.node.reboot()?;
    let (upgraded_id, previous_id) = (format!("{NS}/{upgraded}"), format!("{NS}/{previous}"));
    let report = wait_inspect(
        run,
        "the crash-looping revision set aside, the previous known-good one active",
        |i| {
            let set_aside = i
                .get(&upgraded_id)
                .is_some_and(|c| !c.known_good && c.state == "inactive");
            let back = i
                .get(&previous_id)
                .is_some_and(|c| c.known_good && c.state == "active");
            set_aside && back
        },
    )?;
    let set_aside_after = cut.elapsed();
    wait_api(self_hosted, "the API served by the previous known-good revision")?;
    let api_ready = cut.elapsed();
    progress.say(&format!(
        "{upgraded} set aside {} after the cut; the previous known-good revision serves the API {} after it ({})",
        human_duration(set_aside_after),
        human_duration(api_ready),
        report.summary()
    ));
    wait_for(
        "the RevisionCrashLooping Event on the set-aside revision's pod",
        TIMEOUT,
        || {
            waiting_on_error((|| {
                let events = events_of(run, &upgraded)?;
                let reasons: Vec<String> = (events.iter())
                    .filter_map(|e| e["reason"].as_str().map(str::to_owned))
                    .collect();
                Ok(if reasons.iter().any(|r| r == "RevisionCrashLooping") {
                    Probe::Ready(())
                } else {
                    Probe::Waiting(format!("{reasons:?}"))
                })
            })())
        },
    )?;

    progress.say("the DaemonSet rolled back: the node is handed over to its new pod");
    let patch = json!([
        { "op": "test", "path": format!("/spec/template/spec/containers/0/command/{args}"), "value": flag },
        { "op": "remove", "path": format!("/spec/template/spec/containers/0/command/{args}") },
        { "op": "remove", "path": format!("/spec/template/spec/volumes/{volumes}") },
        { "op": "remove", "path": format!("/spec/template/spec/containers/0/volumeMounts/{mounts}") },
    ]);
    patch_apiserver(&run.kubectl, &patch)?;
    let rolled = wait_new_apiserver_ready(run, "the rolled-back pod Ready", &[previous, &upgraded])?;
    wait_inspect(run, "the previous known-good checkpoint retired", |i| {
        i.get(&previous_id).is_none_or(|c| c.state == "inactive")
    })?;
    wait_api_settled(self_hosted, &rolled)?;
    std::fs::remove_dir_all(&audit_dir)?;
    progress.say(&format!("handed over to {rolled}"));
    let line = json!({
        "scenario": "known-good revision crash-loops after the cut",
        "set aside after the cut": set_aside_after.as_secs_f64(),
        "API ready after the cut": api_ready.as_secs_f64(),
    });
    append_lines("self-hosted-handoffs.jsonl", &[line]).map(drop)
}

/// Waits until a kube-apiserver DaemonSet pod other than the mirror pods and `old` is
/// Ready; returns its name.
fn wait_new_apiserver_ready(run: &NodeRun, what: &str, old: &[&str]) -> anyhow::Result<String> {
    let (pod, _) = wait_for(what, TIMEOUT, || {
        waiting_on_error((|| {
            let pods = pods_of(&run.kubectl, APISERVER)?;
            let ready = (pods.iter())
                .filter(|p| !is_mirror(p) && !old.contains(&name_of(p).as_str()))
                .find(|p| crate::real_node_seed::is_ready(p));
            Ok(match ready {
                Some(pod) => Probe::Ready(name_of(pod)),
                None => Probe::Waiting(format!("{} pod(s)", pods.len())),
            })
        })())
    })?;
    Ok(pod)
}

/// The Events in the namespace about the pod `name`.
fn events_of(run: &NodeRun, name: &str) -> anyhow::Result<Vec<Value>> {
    let events = run
        .kubectl
        .run(&["get", "events", "-n", NS, "-o", "json"], None)?;
    let mut events: Value = serde_json::from_str(&events)?;
    let items = events["items"]
        .as_array_mut()
        .map(std::mem::take)
        .unwrap_or_default();
    Ok(items
        .into_iter()
        .filter(|e| e["involvedObject"]["name"] == name)
        .collect())
}

/// Applies a JSON patch to kube-apiserver's DaemonSet (the three-node upgrades use it too).
pub(crate) fn patch_apiserver(kubectl: &Kubectl, patch: &Value) -> anyhow::Result<()> {
    let patch = patch.to_string();
    let args = [
        "patch",
        "daemonset",
        APISERVER,
        "-n",
        NS,
        "--type",
        "json",
        "-p",
        &patch,
    ];
    kubectl.run(&args, None).map(drop)
}

/// Waits for `/readyz` 200.
fn wait_api(self_hosted: &SelfHosted, what: &str) -> anyhow::Result<()> {
    wait_for(what, TIMEOUT, || {
        Ok(match self_hosted.readyz() {
            200 => Probe::Ready(()),
            status => Probe::Waiting(format!("HTTP {status}")),
        })
    })
    .map(drop)
}

/// Waits for `/readyz` 200 [`SETTLED`] in a row from `server`.
fn wait_api_settled(self_hosted: &SelfHosted, server: &str) -> anyhow::Result<()> {
    let mut serving_since: Option<Instant> = None;
    wait_for(
        &format!("{server} serving for {} in a row", human_duration(SETTLED)),
        TIMEOUT,
        || {
            Ok(match (self_hosted.readyz(), serving_since) {
                (200, Some(since)) if since.elapsed() >= SETTLED => Probe::Ready(()),
                (200, since) => {
                    serving_since = since.or(Some(Instant::now()));
                    Probe::Waiting("serving, not for long yet".into())
                }
                (status, _) => {
                    serving_since = None;
                    Probe::Waiting(format!("HTTP {status}"))
                }
            })
        },
    )
    .map(drop)
}

/// Appends JSON lines to `<target>/e2e/<file>`, and says where.
fn append_lines(file: &str, lines: &[Value]) -> anyhow::Result<std::path::PathBuf> {
    use std::io::Write;
    let dir = ckpt_e2e::image::target_dir().join("e2e");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(file);
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)?;
    for line in lines {
        writeln!(out, "{line}")?;
    }
    Ok(path)
}

/// Waits until every parent's checkpoint is known-good (`inspect`).
fn expect_known_good(run: &NodeRun, parents: &[String]) -> anyhow::Result<()> {
    let report = wait_inspect(run, "the control plane's checkpoints known-good", |i| {
        parents
            .iter()
            .all(|p| i.get(&format!("{NS}/{p}")).is_some_and(|c| c.known_good))
    })?;
    run.progress.say(&format!(
        "known-good: {}",
        parents
            .iter()
            .map(|p| format!("{NS}/{p}"))
            .filter(|p| report.get(p).is_some_and(|c| c.known_good))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    Ok(())
}

/// The demo's account of one cut: each milestone, from the cut, with what it means.
fn narrate(cut: &CutTimeline) {
    let h = |d: Duration| human_duration(d);
    let mut lines = vec![
        format!(
            "{:>8}  containerd and the kubelet are up again (the harness starts them, as systemd would at boot)",
            h(cut.kubelet_up)
        ),
        format!(
            "{:>8}  the kubelet has started pod-checkpointer's static copy from its own checkpoint, and it holds the node's lock",
            h(cut.c2_locked)
        ),
    ];
    if let Some(active) = cut.checkpoints_active {
        lines.push(format!(
            "{:>8}  it has written kube-apiserver's, kube-controller-manager's and kube-scheduler's checkpoints into the kubelet's manifest dir{}",
            h(active),
            cut.agent_share
                .map(|s| format!(" ({} after its process started)", h(s)))
                .unwrap_or_default()
        ));
    }
    lines.extend([
        format!(
            "{:>8}  the checkpointed kube-apiserver answers /readyz: the cluster has an API again",
            h(cut.api_ready)
        ),
        format!(
            "{:>8}  a ConfigMap written before the cut is read back through it",
            h(cut.marker_read)
        ),
        format!(
            "{:>8}  the DaemonSet's and Deployments' own pods run again, and the agent has retired every checkpoint",
            h(cut.retired)
        ),
        format!(
            "{:>8}  the DaemonSet's kube-apiserver serves, for good",
            h(cut.api_back)
        ),
    ]);
    eprintln!(
        "
demo: the power cut, timed from the moment every process of the node was killed:"
    );
    for line in lines {
        eprintln!("  {line}");
    }
    eprintln!(
        "demo: during the handoff from the checkpoint to the real pod the API was unavailable for {} at most; \
         two kube-apiserver containers ran at once for {} (both bind :6443 with --permit-port-sharing). \
         BENCHMARKS.md has a series of cuts (`cargo xtask e2e --long real_node_self_hosted`).\n",
        h(cut.api_gap),
        h(cut.two_apiservers)
    );
}

/// Plain cuts in the longer mode (`E2E_LONG=1`); CI runs none (its two cuts are variants),
/// the demo one.
const LONG_PLAIN_CUTS: usize = 10;

/// What comes before the timed cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    /// The node runs steadily: the parents serve, the checkpoints are inactive.
    Plain,
    /// Right after the agent's own DaemonSet moved to a new image tag, with the static
    /// copy's kept credentials revoked (its ServiceAccount deleted and created again): the
    /// static copy activates offline, is refused by the API server once it serves, and
    /// hands the lock to the DaemonSet copy, which keeps fresh credentials.
    UpgradedAndRevoked,
    /// A first cut, and the timed one once that recovery is under way (the checkpoints
    /// active and serving, the parents not back yet).
    DuringRecovery,
}

/// Each cut's line, then min / median / max of each milestone over the cuts; the lines are
/// appended to `<target>/e2e/self-hosted-cuts.jsonl` too, and this run's cuts drawn as a
/// timeline in `<target>/e2e/self-hosted-cuts.png` (docs/behaviour.md shows one).
fn report_cuts(run: &NodeRun, cuts: &[CutTimeline]) -> anyhow::Result<()> {
    let lines: Vec<Value> = cuts.iter().map(CutTimeline::to_json).collect();
    let path = append_lines("self-hosted-cuts.jsonl", &lines)?;
    let moments = &CutTimeline::MILESTONES[..CutTimeline::MOMENTS];
    let names: Vec<&str> = moments.iter().map(|(name, _)| *name).collect();
    // Drawn from the JSON lines just written, so the picture is those figures.
    let rows: Vec<ckpt_e2e::self_hosted::plot::CutRow> = lines
        .iter()
        .map(|line| ckpt_e2e::self_hosted::plot::CutRow {
            label: format!(
                "cut {} ({})",
                line["cut"],
                line["variant"].as_str().unwrap_or("?")
            ),
            seconds: names.iter().map(|name| line[*name].as_f64()).collect(),
        })
        .collect();
    let png = path.with_file_name("self-hosted-cuts.png");
    let title = format!(
        "pod-checkpointer: a self-hosted node's power cuts, kube-apiserver {}",
        run.plane.release()
    );
    ckpt_e2e::self_hosted::plot::draw(&png, &names, &rows, &title)?;
    run.progress
        .say(&format!("the cuts' timeline drawn in {}", png.display()));
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
    run.progress.say(&format!(
        "{} cut(s) (load average {load}), min / median / max from the cut; lines appended to {}",
        cuts.len(),
        path.display()
    ));
    if crate::demo_mode() {
        // One cut: the demo narrates it instead.
        return Ok(());
    }
    for (name, of) in CutTimeline::MILESTONES {
        let samples: Vec<f64> = cuts.iter().filter_map(|c| Some(of(c)?.as_secs_f64())).collect();
        if let Some(s) = ckpt_e2e::bench::stats::summarize(&samples) {
            let f = ckpt_e2e::bench::stats::seconds;
            eprintln!(
                "  {name:<36} {:>8} {:>8} {:>8}  (n={})",
                f(s.min),
                f(s.median),
                f(s.max),
                s.n
            );
        }
    }
    Ok(())
}

/// The names of the control plane's running API pods, one per component.
fn running_parents(run: &NodeRun) -> anyhow::Result<Vec<String>> {
    COMPONENTS
        .iter()
        .map(|app| {
            let pods = pods_of(&run.kubectl, app)?;
            pods.iter()
                .find(|p| !is_mirror(p) && pod_running(p))
                .map(name_of)
                .with_context(|| format!("no {app} pod runs"))
        })
        .collect()
}

/// Waits until [`running_parents`] finds every component's pod running. Right after the
/// previous step a parent's container can be between two starts (a restart the kubelet
/// makes): the step after needs them running, and says when it had to wait for that.
fn wait_running_parents(run: &NodeRun) -> anyhow::Result<Vec<String>> {
    let (parents, waited) = wait_for("the control plane's parents running", TIMEOUT, || {
        Ok(match running_parents(run) {
            Ok(names) => Probe::Ready(names),
            Err(e) => Probe::Waiting(format!("{e:#}")),
        })
    })?;
    if waited > Duration::from_secs(1) {
        run.progress.say(&format!(
            "the control plane's parents ran again after {} ({})",
            human_duration(waited),
            parents.join(", ")
        ));
    }
    Ok(parents)
}

/// A Deployment's pod needs the controller-manager (ReplicaSet, pod) and the scheduler
/// (binding): it runs, and is deleted again.
fn check_scheduling(run: &NodeRun) -> anyhow::Result<()> {
    let name = "e2e-self-hosted-probe";
    let labels = json!({ "app": name });
    run.kubectl.apply(&[json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": { "name": name, "namespace": NS },
        "spec": {
            "replicas": 1,
            "selector": { "matchLabels": labels },
            "template": {
                "metadata": { "labels": labels },
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "automountServiceAccountToken": false,
                    "containers": [{
                        "name": "sleep",
                        "image": BUSYBOX_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["sleep", "3600"]
                    }]
                }
            }
        }
    })])?;
    wait_for("the probe Deployment's pod running", TIMEOUT, || {
        waiting_on_error((|| {
            let pods = run.kubectl.pods(NS, &format!("app={name}"))?;
            Ok(if pods.iter().any(pod_running) {
                Probe::Ready(())
            } else {
                Probe::Waiting(format!("{} pod(s), none running", pods.len()))
            })
        })())
    })?;
    run.kubectl
        .run(&["delete", "deployment", name, "-n", NS, "--wait=true"], None)
        .map(drop)
}

/// What one power cut took, each from the cut.
#[derive(Debug)]
struct CutTimeline {
    n: usize,
    cut: Cut,
    /// containerd and the kubelet up again (the harness's share, not the node's).
    kubelet_up: Duration,
    /// A copy of the agent took the lock (the static copy C2, unless the API was back first).
    c2_locked: Duration,
    /// Every control-plane checkpoint active (`None` when they were active at the cut).
    checkpoints_active: Option<Duration>,
    /// The first `/readyz` 200 of the node's API server.
    api_ready: Duration,
    /// The marker written before the cut read back.
    marker_read: Duration,
    /// Every parent running and every checkpoint retired.
    retired: Duration,
    /// The parent API server serving (for good: [`SETTLED`] in a row from then on).
    api_back: Duration,
    /// The longest stretch without `/readyz` 200 after the first one, until settled.
    api_gap: Duration,
    /// How long two kube-apiserver containers of the node ran at once: the checkpoint
    /// beside its parent until the parent is Ready (`handoff: when-ready`), then while the
    /// checkpoint's static pod stops.
    two_apiservers: Duration,
    /// How long they did once the checkpoint's manifest was gone (its static pod stopping).
    two_after_retired: Duration,
    /// From the static copy's process start to the last needed active manifest written.
    agent_share: Option<Duration>,
}

/// A milestone's name and how to read it from a cut (`None`: not measured in that cut).
type Milestone = (&'static str, fn(&CutTimeline) -> Option<Duration>);

impl CutTimeline {
    /// Every duration, by the name the summary shows (`None`: not measured in this cut).
    /// The first [`Self::MOMENTS`] are moments after the cut; the rest, lengths of time.
    const MILESTONES: [Milestone; 11] = [
        ("kubelet up", |c| Some(c.kubelet_up)),
        ("the agent holds the lock", |c| Some(c.c2_locked)),
        ("checkpoints active", |c| c.checkpoints_active),
        ("API ready (/readyz 200)", |c| Some(c.api_ready)),
        ("marker read back", |c| Some(c.marker_read)),
        ("parents back, checkpoints retired", |c| Some(c.retired)),
        ("parent API server serving", |c| Some(c.api_back)),
        ("API gap in the handoff", |c| Some(c.api_gap)),
        ("two API servers at once", |c| Some(c.two_apiservers)),
        ("two API servers after the retirement", |c| {
            Some(c.two_after_retired)
        }),
        ("the agent's share", |c| c.agent_share),
    ];

    /// How many of [`Self::MILESTONES`] are moments after the cut (the timeline's marks).
    const MOMENTS: usize = 7;

    fn to_json(&self) -> Value {
        let mut line = json!({ "cut": self.n, "variant": format!("{:?}", self.cut) });
        for (name, of) in Self::MILESTONES {
            line[name] = json!(of(self).map(|d| d.as_secs_f64()));
        }
        line
    }

    fn describe(&self) -> String {
        let h = |d: Duration| human_duration(d);
        format!(
            "kubelet up {}, the agent holds the lock {}, checkpoints active {}, API ready {}, marker read {}, \
             parents back and checkpoints retired {}, the parent API server serving {}; \
             API gap during the handoff {}, two API servers at once {} ({} after the retirement); the agent's share {}",
            h(self.kubelet_up),
            h(self.c2_locked),
            self.checkpoints_active
                .map_or_else(|| "before the cut".to_owned(), h),
            h(self.api_ready),
            h(self.marker_read),
            h(self.retired),
            h(self.api_back),
            h(self.api_gap),
            h(self.two_apiservers),
            h(self.two_after_retired),
            self.agent_share.map_or_else(|| "unknown".to_owned(), h)
        )
    }
}

/// Cuts the node's power once and times its way back (see the module doc).
fn power_cut_once(
    run: &mut NodeRun,
    self_hosted: &SelfHosted,
    n: usize,
    kind: Cut,
) -> anyhow::Result<CutTimeline> {
    let progress = run.progress;
    if kind == Cut::UpgradedAndRevoked {
        upgrade_and_revoke(run, self_hosted)?;
    }
    let (c1, _) = wait_agent_pair(run, "C1 and its static copy C2 running")?;
    let c1 = c1.as_str();
    let parents = wait_running_parents(run)?;
    let marker = format!("e2e-marker-{n}");
    let value = random_hex(8)?;
    run.kubectl.apply(&[json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": marker, "namespace": NS },
        "data": { "value": value }
    })])?;
    let c2 = format!("{c1}-{NODE_NAME}");

    if kind == Cut::DuringRecovery {
        progress.say(&format!(
            "cut {n}: a first power cut, then the timed one during the recovery"
        ));
        run.node.reboot()?;
        wait_inspect(run, "every control-plane checkpoint active", |i| {
            parents.iter().all(|p| state_of(i, p) == Some("active"))
        })?;
        wait_api(self_hosted, "the checkpointed API server's /readyz 200")?;
    } else {
        progress.say(&format!("cut {n}: power off with {} running", parents.join(", ")));
    }
    // Sampled from just before the timed cut (not the first cut of a cut during the recovery).
    let readyz = {
        let self_hosted = self_hosted.clone();
        Sampler::start(SAMPLE_EVERY, move || self_hosted.readyz())
    };
    let apiservers = {
        let cri = CriClient::new(&run.node.containerd_socket().to_string_lossy());
        let manifests = run.node.manifests_dir();
        Sampler::start(SAMPLE_EVERY, move || {
            (running_apiservers(&cri), apiserver_checkpoint_active(&manifests))
        })
    };
    let cut = Instant::now();
    let cut_at = ckpt_core::Timestamp::now();
    let cut_wall = std::time::SystemTime::now();
    run.node.reboot()?;
    // Every process of the node is dead by now: a sample from before could still have seen
    // the old API server answer while the cut was under way.
    let rebooted = Instant::now();
    let kubelet_up = cut.elapsed();

    // Usually C2, the static copy; C1 when the API is back before C2 runs (a cut during
    // the recovery: the kubelet starts the active checkpoints from its disk at once).
    let (_, _) = wait_for("a copy of the agent to take the lock", TIMEOUT, || {
        Ok(if lock_taken_since(run, cut_at) {
            Probe::Ready(())
        } else {
            Probe::Waiting(format!("C2's logs: {}", last_log_line(run, &c2)))
        })
    })?;
    let c2_locked = cut.elapsed();
    // Cut during the recovery, the active manifests are on the node's disk already: the
    // kubelet starts them itself, before the agent runs.
    let (checkpoints_active, agent_share) = match kind {
        Cut::Plain | Cut::UpgradedAndRevoked => {
            let (seen, share) = wait_active(run, &parents, cut)?;
            (Some(seen), share)
        }
        Cut::DuringRecovery => (None, None),
    };
    wait_api(self_hosted, "the API server's /readyz 200")?;
    let api_ready = cut.elapsed();
    let path = format!("/api/v1/namespaces/{NS}/configmaps/{marker}");
    wait_for("the marker read back", TIMEOUT, || {
        Ok(match self_hosted.get(&path, Duration::from_secs(2)) {
            (200, body) => {
                let read: Value = serde_json::from_str(&body).context("the marker is not JSON")?;
                anyhow::ensure!(
                    read["data"]["value"] == value.as_str(),
                    "the marker changed: {body}"
                );
                Probe::Ready(())
            }
            (status, _) => Probe::Waiting(format!("HTTP {status}")),
        })
    })?;
    let marker_read = cut.elapsed();
    let mut last_report: Option<Inspect> = None;
    wait_for(
        "every parent running and every checkpoint retired",
        TIMEOUT,
        || {
            waiting_on_error((|| {
                let report = crate::real_node_seed::inspect_node(run)?;
                let retired = parents.iter().all(|p| state_of(&report, p) == Some("inactive"));
                let running = running_parents(run);
                last_report = Some(report);
                Ok(match running {
                    Ok(names) if retired && names == parents => Probe::Ready(()),
                    running => Probe::Waiting(format!(
                        "retired: {retired}; running parents: {:?}; {}",
                        running.map_err(|e| format!("{e:#}")),
                        last_report.as_ref().map(Inspect::summary).unwrap_or_default()
                    )),
                })
            })())
        },
    )?;
    let retired = cut.elapsed();
    // The parent API server takes the port over only now: until it serves, the API is down.
    wait_api_settled(self_hosted, "the parent API server")?;
    let settled = Instant::now();
    let api_back = cut.elapsed() - SETTLED;
    let readyz = readyz.stop();
    let apiservers = apiservers.stop();
    let first_ready = first_at(&readyz, rebooted, |s| *s == 200).context("no /readyz 200 was sampled")?;
    let api_gap = longest_lapse(&readyz, first_ready, settled, |s| *s == 200);
    let two = |running: &Option<Vec<String>>| running.as_ref().is_some_and(|r| r.len() >= 2);
    let two_apiservers = time_holding(&apiservers, |(running, _)| two(running));
    // Beside its parent the checkpoint stays until the parent is Ready on a synced view
    // (after the revocation, only once the lock went to the DaemonSet copy); once its
    // manifest is gone, its static pod must stop within its grace period (no port battle).
    let two_after_retired = time_holding(&apiservers, |(running, active)| !active && two(running));
    let grace = Duration::from_secs(u64::from(APISERVER_GRACE_SECONDS) + 2);
    anyhow::ensure!(
        two_after_retired <= grace,
        "two kube-apiserver containers ran at once for {} after the checkpoint was retired (longer than the grace period + 2 s)",
        human_duration(two_after_retired)
    );
    let (_, _) = wait_agent_pair(run, "C1 running again beside C2")?;
    if kind == Cut::UpgradedAndRevoked {
        let token = host(run, KEPT_TOKEN)?;
        // The DaemonSet copy mints the kept token whether it holds the lock or waits; the
        // static copy re-reads it within a minute (or hands the lock over after a minute of
        // 401s, whichever comes first).
        let (_, _) = wait_for(
            "the DaemonSet copy to keep a fresh token for the static copy",
            TIMEOUT,
            || {
                let kept_at = std::fs::metadata(&token).and_then(|m| m.modified()).ok();
                Ok(match kept_at {
                    Some(at) if at > cut_wall => Probe::Ready(()),
                    at => Probe::Waiting(format!("the kept token written at {at:?}")),
                })
            },
        )?;
        let lock_file = lock_file(run)?;
        let (holder, _) = wait_for("a pod's holder record in the lock", TIMEOUT, || {
            Ok(match lock_holder(&lock_file)? {
                Some(Holding { pod: Some(pod), .. }) => Probe::Ready(pod),
                other => Probe::Waiting(format!("held by {other:?}")),
            })
        })?;
        wait_health(run, &holder, "ok")?;
        progress.say(&format!(
            "the agent is synced again after the revocation: a fresh kept token, the holder {holder} ready"
        ));
    }
    let timeline = CutTimeline {
        n,
        cut: kind,
        kubelet_up,
        c2_locked,
        checkpoints_active,
        api_ready,
        marker_read,
        retired,
        api_back,
        api_gap,
        two_apiservers,
        two_after_retired,
        agent_share,
    };
    progress.say(&format!("cut {n} ({kind:?}): {}", timeline.describe()));
    Ok(timeline)
}

/// Whether a copy of the agent (any pod of its name, static or not) logged taking the lock
/// at or after `since` (the agent's own timestamp, to the second). Counting lines would not
/// do: the kubelet deletes the logs of containers lost in a power cut.
fn lock_taken_since(run: &NodeRun, since: ckpt_core::Timestamp) -> bool {
    let since = since.to_rfc3339();
    let since = &since[..since.len().min(19)];
    pods_named_like(run, "pod-checkpointer").iter().any(|pod| {
        log_lines(run, pod)
            .iter()
            .any(|line| line.contains(LOCK_TAKEN) && line.get(..19).is_some_and(|at| at >= since))
    })
}

/// Where the DaemonSet copy keeps the static copy's token, on the node.
const KEPT_TOKEN: &str = "/etc/kubernetes/pod-checkpointer/token";
/// The static copy's ServiceAccount `deploy` creates.
const STATIC_ACCOUNT: &str = "pod-checkpointer-static";

/// The agent's DaemonSet to the upgrade's tag (the same binary), then the static copy's
/// ServiceAccount deleted and created again, which revokes every token kept for it.
fn upgrade_and_revoke(run: &NodeRun, self_hosted: &SelfHosted) -> anyhow::Result<()> {
    let (old_c1, _) = wait_agent_pair(run, "C1 and its static copy C2 running")?;
    let image = upgrade_image();
    // An operator's upgrade keeps their settings: without the handoff timeout the
    // ConfigMap went back to the default (2m), which the bad-upgrade step then waited out.
    deploy_with(
        run,
        self_hosted.kubeconfig(),
        "grace-period",
        &["--image", &image, "--handoff-timeout", HANDOFF_TIMEOUT],
    )?;
    let (_, _) = wait_for("C1 on the new tag, beside its static copy", TIMEOUT, || {
        waiting_on_error((|| {
            let (c1, _) = wait_agent_pair(run, "C1 and C2 running")?;
            Ok(if c1 != old_c1 {
                Probe::Ready(())
            } else {
                Probe::Waiting(format!("C1 is still {c1}"))
            })
        })())
    })?;
    let account = run
        .kubectl
        .get("serviceaccount", NS, STATIC_ACCOUNT)?
        .with_context(|| format!("deploy made no ServiceAccount {STATIC_ACCOUNT}"))?;
    run.kubectl.run(
        &[
            "delete",
            "serviceaccount",
            STATIC_ACCOUNT,
            "-n",
            NS,
            "--wait=true",
        ],
        None,
    )?;
    let mut metadata = json!({ "name": STATIC_ACCOUNT, "namespace": NS });
    if account["metadata"]["labels"].is_object() {
        metadata["labels"] = account["metadata"]["labels"].clone();
    }
    run.kubectl
        .create(&json!({ "apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata }))?;
    run.progress.say(&format!(
        "the agent upgraded to {image}; the static copy's kept credentials revoked"
    ));
    Ok(())
}

/// Whether a kube-apiserver checkpoint's manifest is in the node's manifests dir.
fn apiserver_checkpoint_active(manifests: &std::path::Path) -> bool {
    let prefix = format!("{NS}_{APISERVER}-");
    std::fs::read_dir(manifests).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(&prefix))
    })
}

/// The pods of the kube-apiserver containers the node runs (`None` while the runtime does
/// not answer, as during the reboot).
pub(crate) fn running_apiservers(cri: &CriClient) -> Option<Vec<String>> {
    let containers = cri.containers().ok()?;
    Some(
        containers
            .into_iter()
            .filter(|c| c.name == APISERVER && c.state == ContainerState::Running)
            .map(|c| {
                c.labels
                    .get("io.kubernetes.pod.name")
                    .cloned()
                    .unwrap_or_default()
            })
            .collect(),
    )
}

/// Waits until every parent's checkpoint is active; returns when that was seen (from the
/// cut) and the agent's own share: from the static copy's process start to the last of
/// those active manifests written (`None` when the process or a file cannot be found).
fn wait_active(
    run: &NodeRun,
    parents: &[String],
    cut: Instant,
) -> anyhow::Result<(Duration, Option<Duration>)> {
    let report = wait_inspect(run, "every control-plane checkpoint active", |i| {
        parents.iter().all(|p| state_of(i, p) == Some("active"))
    })?;
    let seen = cut.elapsed();
    let written = report
        .checkpoints
        .iter()
        .filter(|c| parents.iter().any(|p| c.pod == format!("{NS}/{p}")))
        .map(|c| {
            let manifest = c.active_manifest.as_ref()?;
            std::fs::metadata(manifest).ok()?.modified().ok()
        })
        .collect::<Option<Vec<_>>>()
        .and_then(|times| times.into_iter().max());
    let started = c2_process_start(run);
    let share = match (started, written) {
        (Some(started), Some(written)) => written.duration_since(started).ok(),
        _ => None,
    };
    Ok((seen, share))
}

/// When the running static copy's process started (wall clock): its container's process
/// found by its cgroup (cgroupfs `/k8s.io/<container id>`), its start from `/proc`.
fn c2_process_start(run: &NodeRun) -> Option<std::time::SystemTime> {
    let cri = CriClient::new(&run.node.containerd_socket().to_string_lossy());
    let id = cri
        .containers()
        .ok()?
        .into_iter()
        .find(|c| {
            c.name == "pod-checkpointer"
                && c.state == ContainerState::Running
                && c.labels
                    .get("io.kubernetes.pod.name")
                    .is_some_and(|pod| pod.ends_with(&format!("-{NODE_NAME}")))
        })?
        .id;
    let pid = std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        cgroup.contains(&id).then_some(pid)
    })?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22, counted after the command's closing parenthesis (field 2 may hold spaces).
    let ticks: u64 = stat
        .rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()?;
    let boot: u64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix("btime ")?.trim().parse().ok())?;
    // USER_HZ is 100 on Linux for every architecture this runs on.
    let since_boot = Duration::from_millis(ticks * 10);
    Some(std::time::UNIX_EPOCH + Duration::from_secs(boot) + since_boot)
}
