//! `cargo xtask bench --fleet N` (issue 39): what a fleet of agents costs one API server, at
//! idle, through a cluster-wide outage and at the API server's return, at several fleet
//! sizes.
//!
//! Real: the release agent, unchanged, one process per node (`node-0001` …) with its own
//! checkpoint dir, lock, kubeconfig and static-token identity (`fleet_user(i)`, in
//! `FLEET_GROUP`, bound to the deployed agent's rules); one kube-apiserver and etcd of the
//! release CI runs. Faked, and only this: no kubelets (the bench creates the Nodes, the pods
//! and their Running/Ready statuses), no controller-manager (its node-lifecycle controller
//! would taint kubelet-less nodes and evict their pods), and one process, this one, serves
//! every node's CRI runtime (`ckpt-testkit`'s fake, on a socket per node), which runs the
//! containers the statuses name.
//!
//! Each node has the agent's own pod (a DaemonSet's, checkpointing itself) and two annotated
//! parents mounting the node's Secret and ConfigMap. With two CPUs the API server and etcd
//! run on CPU 0, the agents, the fake runtimes and the bench on CPU 1, so each side's CPU
//! figure is its own.
//!
//! What is counted, and how:
//! - requests: the API server's audit log (every request of the fleet's group), one per
//!   audit ID, binned by the time the API server received it;
//! - connection attempts: per agent, by the kernel (see [`connections`]), sampled every
//!   second; refused ones count, so the outage's are seen;
//! - milestones (checkpoint activated, deactivated, view synced): the agents' JSON logs;
//! - CPU and memory: `/proc` of the API server and of every agent.
//!
//! The return's clocks start when the restarted API server first answers `/readyz` with 200.

mod analysis;
mod connections;
mod plot;
mod report;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use ckpt_core::Timestamp;
use ckpt_cri::proto;
use ckpt_testkit::FakeCri;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use self::analysis::{Milestone, Request};
use self::connections::ConnectionCounter;
use self::report::{Idle, Outage, Return, SizeResult};
use super::audit;
use super::procfs::{self, clock_ticks_per_second};
use crate::apt::Apt;
use crate::command::run_command;
use crate::e2e_env::{self, ControlPlane, FLEET_GROUP, Release, StartOptions, fleet_user};
use crate::harness::agent::{Agent, AgentConfig, AgentDirs};
use crate::harness::kubectl::Kubectl;
use crate::harness::objects::{
    CHECKPOINTER_SERVICE_ACCOUNT, Owner, PodBuilder, STATIC_SERVICE_ACCOUNT, cluster_role_binding,
    config_map, daemon_set, namespace, role_binding, secret, service_account, token_role_binding,
};
use crate::harness::testbed::{AGENT_CLUSTER_ROLE, AGENT_ROLE, AGENT_TOKEN_ROLE, agent_cluster_roles};
use crate::process::send_signal;
use crate::progress::{Progress, human_duration};
use crate::wait::{Probe, wait_for};

/// The namespace of every node's pods, Secrets and ConfigMaps, as `kube-system` would be.
const NS: &str = "fleet";
/// Agent `i` reaches the API server through `127.0.0.1:(PORT_BASE + i)`.
const PORT_BASE: u16 = 21000;
/// After the fleet is checkpointed and before the idle window: the start-up's requests and
/// the agents' fast probes are over.
const SETTLE: Duration = Duration::from_secs(20);
/// The return is reported second by second over its first minute.
const RETURN_WINDOW: Duration = Duration::from_secs(60);
/// How long the bench waits for every agent to be synced and to have retired its
/// checkpoints after the return, before it reports those that did not.
const RETURN_LIMIT: Duration = Duration::from_secs(180);
/// The kubelet version the bench's Nodes report.
const KUBELET_VERSION: &str = "v1.37.2";
/// The agents' kubelet URL: nothing listens there. With the CRI the agent needs no kubelet.
const NO_KUBELET: &str = "http://127.0.0.1:9";

/// What `--fleet` measures.
pub(crate) struct FleetOptions {
    /// The fleet sizes, ascending.
    pub(crate) sizes: Vec<usize>,
    pub(crate) idle: Duration,
    pub(crate) outage: Duration,
    pub(crate) kubernetes: Release,
}

/// The default sizes up to `n`: 50, 100, 200, … doubling while below `n`, then `n`.
pub(crate) fn default_sizes(n: usize) -> Vec<usize> {
    let mut sizes: Vec<usize> = std::iter::successors(Some(50), |s| Some(s * 2))
        .take_while(|s| *s < n)
        .collect();
    sizes.push(n);
    sizes
}

pub(crate) fn run(options: &FleetOptions) -> anyhow::Result<()> {
    let started_at = SystemTime::now();
    let progress = Progress::timed("bench");
    anyhow::ensure!(
        options.sizes.iter().all(|&n| n > 0),
        "every fleet size must be at least 1"
    );
    let max = options.sizes.iter().copied().max().context("no fleet size")?;
    let root = crate::project_root();
    let mut apt = Apt::new(root.join("target/bench/apt.log"), progress);
    // iptables counts the connection attempts; gnuplot draws the curve.
    apt.install(&["iptables", "gnuplot-nox"])?;
    progress.say("building the control plane's binaries (cached) and the release agent");
    let bins = e2e_env::ensure_built_release(options.kubernetes)?;
    crate::run("cargo", &["build", "-p", "ckpt-bin", "--release"])?;
    let agent_bin = crate::image::target_dir().join("release/pod-checkpointer");
    let commit = super::git_commit();
    let load_before = procfs::load_average();
    // Before pinning: then this process sees one CPU.
    let machine = procfs::machine();
    let pinned = std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2);
    if pinned {
        pin(std::process::id(), 1)?;
    }
    let plane = ControlPlane::start(&StartOptions {
        fleet_agents: max,
        ..StartOptions::new(bins)
    })?;
    let mut fleet = Fleet::new(plane, agent_bin, max, pinned, progress)?;
    let mut results = Vec::new();
    let mut failures = Vec::new();
    for &n in &options.sizes {
        crate::interrupt::check()?;
        progress.say(&format!("=== {n} agents ==="));
        match fleet.measure(n, options) {
            Ok(result) => results.push(result),
            Err(e) => {
                crate::interrupt::check()?;
                progress.say(&format!("{n} agents FAILED: {e:#}"));
                failures.push(format!("{n} agents: {e:#}"));
                fleet.recover()?;
            }
        }
    }
    // The agents' logs outlive the work dir: what the figures came from.
    let logs = root
        .join("target/bench")
        .join(format!("{}-logs", report::stem(started_at)));
    if let Err(e) = copy_dir(&fleet.dir.join("logs"), &logs) {
        progress.say(&format!(
            "cannot keep the agents' logs in {}: {e:#}",
            logs.display()
        ));
    }
    drop(fleet);
    let run = report::Run {
        started_at,
        command: super::command_line(),
        commit,
        machine,
        load_before,
        load_after: procfs::load_average(),
        kubernetes: options.kubernetes,
        pinned,
        idle: options.idle,
        outage: options.outage,
        failures: failures.clone(),
    };
    let paths = report::write(&root.join("target/bench"), &run, &results)?;
    eprintln!("{}", fs::read_to_string(&paths.markdown).unwrap_or_default());
    progress.say(&format!(
        "done; results in {}, {} and {}",
        paths.json.display(),
        paths.markdown.display(),
        paths.plot.display()
    ));
    anyhow::ensure!(failures.is_empty(), "some sizes failed:\n{}", failures.join("\n"));
    Ok(())
}

/// Copies the files of `from` into a new dir `to`.
fn copy_dir(from: &Path, to: &Path) -> anyhow::Result<()> {
    fs::create_dir_all(to).with_context(|| format!("cannot create {}", to.display()))?;
    for entry in fs::read_dir(from).with_context(|| format!("cannot read {}", from.display()))? {
        let entry = entry?;
        fs::copy(entry.path(), to.join(entry.file_name()))
            .with_context(|| format!("cannot copy {}", entry.path().display()))?;
    }
    Ok(())
}

/// Pins `pid`'s threads to `cpu` (the threads it starts later inherit it).
fn pin(pid: u32, cpu: usize) -> anyhow::Result<()> {
    run_command(std::process::Command::new("taskset").args([
        "-a",
        "-p",
        "-c",
        &cpu.to_string(),
        &pid.to_string(),
    ]))
    .with_context(|| format!("cannot pin pid {pid} to CPU {cpu}"))
    .map(drop)
}

/// One node's names.
struct NodeNames {
    node: String,
    /// The agent's own pod.
    agent_pod: String,
    parents: [String; 2],
}

impl NodeNames {
    fn of(i: usize) -> NodeNames {
        let node = format!("node-{i:04}");
        NodeNames {
            agent_pod: format!("pod-checkpointer-{node}"),
            parents: [format!("parent-a-{node}"), format!("parent-b-{node}")],
            node,
        }
    }

    fn pods(&self) -> impl Iterator<Item = &String> {
        std::iter::once(&self.agent_pod).chain(&self.parents)
    }
}

/// The plane, the objects of `max` nodes, their runtimes, and the connection counters.
struct Fleet {
    plane: ControlPlane,
    agent_bin: PathBuf,
    dir: PathBuf,
    counter: ConnectionCounter,
    /// Every node's runtime, served by the tasks of `_runtime` (dropped after them).
    _runtimes: Vec<FakeCri>,
    /// Its one worker serves the fake runtimes.
    _runtime: tokio::runtime::Runtime,
    pinned: bool,
    progress: Progress,
}

impl Fleet {
    fn new(
        plane: ControlPlane,
        agent_bin: PathBuf,
        max: usize,
        pinned: bool,
        progress: Progress,
    ) -> anyhow::Result<Fleet> {
        if pinned {
            // The API side on CPU 0; the bench (and the agents it starts) stay on CPU 1.
            for pid in [plane.apiserver_pid(), plane.etcd_pid()].into_iter().flatten() {
                pin(pid, 0)?;
            }
        }
        let dir = plane.workdir().join("fleet");
        fs::create_dir_all(dir.join("logs")).with_context(|| format!("cannot create {}", dir.display()))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        let counter = ConnectionCounter::install(PORT_BASE, max, plane.apiserver_port())?;
        let kubectl = Kubectl::new(&plane.kubeconfig(), &plane.workdir().join("kubectl-cache"));
        progress.say(&format!(
            "creating {max} nodes, their pods, Secrets and ConfigMaps"
        ));
        let owner = create_shared_objects(&kubectl)?;
        let client = runtime.block_on(super::admin_client(&plane.kubeconfig()))?;
        let created = Instant::now();
        runtime.block_on(create_nodes(&client, &owner, max))?;
        progress.say(&format!(
            "{max} nodes created, pods Running and Ready, in {}",
            human_duration(created.elapsed())
        ));
        let sockets = dir.join("cri");
        fs::create_dir_all(&sockets)?;
        let runtimes = {
            let _entered = runtime.enter();
            (1..=max)
                .map(|i| {
                    let names = NodeNames::of(i);
                    let cri = FakeCri::start_at(&sockets.join(format!("{}.sock", names.node)), true, false);
                    for pod in names.pods() {
                        cri.add_pod(NS, pod, proto::SANDBOX_READY, &[proto::CONTAINER_RUNNING]);
                    }
                    cri
                })
                .collect()
        };
        Ok(Fleet {
            plane,
            agent_bin,
            dir,
            counter,
            _runtimes: runtimes,
            _runtime: runtime,
            pinned,
            progress,
        })
    }

    /// The `run` flags of agent `i`.
    fn agent_config(&self, i: usize) -> anyhow::Result<AgentConfig> {
        let names = NodeNames::of(i);
        let root = self.dir.join(&names.node);
        let manifests = root.join("manifests");
        fs::create_dir_all(&manifests).with_context(|| format!("cannot create {}", manifests.display()))?;
        let kubeconfig = self.plane.write_kubeconfig(
            &format!("kubeconfig-{}", names.node),
            &format!("https://127.0.0.1:{}", self.counter.port(i)?),
            &fleet_user(i),
        )?;
        Ok(AgentConfig {
            label: names.node.clone(),
            node_name: names.node.clone(),
            pod_name: names.agent_pod.clone(),
            pod_namespace: NS.into(),
            kubeconfig: Some(kubeconfig),
            kubelet_url: NO_KUBELET.into(),
            runtime_endpoint: format!(
                "unix://{}",
                self.dir
                    .join("cri")
                    .join(format!("{}.sock", names.node))
                    .display()
            ),
            dirs: AgentDirs::under(&root, &manifests)?,
            namespaces: vec![NS.into()],
            gc_strategy: None,
            grace_period: None,
            extra_args: vec!["--log-format=json".into()],
        })
    }

    /// After a failed size: the API server answers again.
    fn recover(&mut self) -> anyhow::Result<()> {
        if self.plane.api_get("/readyz").is_ok_and(|(code, _)| code == 200) {
            return Ok(());
        }
        self.plane.restart_apiserver()?;
        pin_apiserver(&self.plane, self.pinned)
    }

    /// One size: `n` agents started, checkpointed, idle, through the outage and back; then
    /// stopped.
    fn measure(&mut self, n: usize, options: &FleetOptions) -> anyhow::Result<SizeResult> {
        let audit_log = self.plane.audit_log();
        let log_from = audit::log_len(&audit_log)?;
        let mut agents = self.start_agents(n)?;
        let outcome = self.measure_agents(&mut agents, options);
        // Stopping the agents ends their watches, whose audit events are then complete.
        self.progress.say(&format!("stopping {n} agents"));
        for agent in &agents {
            let _ = send_signal(agent.pid(), "TERM");
        }
        for agent in &mut agents {
            let _ = agent.stop();
        }
        let mut measured = outcome?;
        let log_to = audit::log_len(&audit_log)?;
        let text = audit::read_between(&audit_log, log_from, log_to)?;
        let requests = analysis::requests(&text, FLEET_GROUP);
        let logs: Vec<_> = (agents.iter())
            .map(|a| analysis::log_lines(&a.log_text()))
            .collect();
        measured.evaluate(n, &requests, &logs);
        Ok(measured.result)
    }

    fn start_agents(&self, n: usize) -> anyhow::Result<Vec<Agent>> {
        self.progress.say(&format!("starting {n} agents"));
        let started = Instant::now();
        let mut agents = Vec::with_capacity(n);
        for i in 1..=n {
            let config = self.agent_config(i)?;
            agents.push(Agent::start_with_log_filter(
                &self.agent_bin,
                &config,
                &self.dir.join("logs"),
                super::AGENT_LOG_LEVEL,
            )?);
        }
        for agent in &mut agents {
            agent.wait_ready()?;
        }
        // Each agent has checkpointed its own pod and both parents.
        let dirs: Vec<PathBuf> = (1..=n)
            .map(|i| {
                self.dir
                    .join(NodeNames::of(i).node)
                    .join("checkpoints/inactive-manifests")
            })
            .collect();
        wait_for(
            &format!("{n} agents with 3 checkpoints each"),
            Duration::from_secs(120) + Duration::from_millis(200) * u32::try_from(n).unwrap_or(u32::MAX),
            || {
                let short = dirs.iter().filter(|d| super::count_files(d, NS) < 3).count();
                Ok(if short == 0 {
                    Probe::Ready(())
                } else {
                    Probe::Waiting(format!("{short} agents with fewer"))
                })
            },
        )?;
        self.progress.say(&format!(
            "{n} agents ready and checkpointed in {}; settling for {}",
            human_duration(started.elapsed()),
            human_duration(SETTLE)
        ));
        sleep(SETTLE);
        Ok(agents)
    }

    fn measure_agents(&mut self, agents: &mut [Agent], options: &FleetOptions) -> anyhow::Result<Measured> {
        let n = agents.len();
        let pids: Vec<u32> = agents.iter().map(Agent::pid).collect();
        // Idle.
        self.progress
            .say(&format!("idle for {}", human_duration(options.idle)));
        let api_before = self.apiserver_sample()?;
        let agents_before = agents_sample(&pids)?;
        let attempts_before = self.counter.read()?;
        let idle_from = Timestamp::now();
        sleep(options.idle);
        let idle_to = Timestamp::now();
        let api_after = self.apiserver_sample()?;
        let agents_after = agents_sample(&pids)?;
        let attempts_after = self.counter.read()?;
        for agent in agents.iter_mut() {
            agent.ensure_running()?;
        }
        let window = idle_to.since(idle_from).as_secs_f64();
        let ticks = clock_ticks_per_second() as f64;
        let idle = Idle {
            window_s: window,
            apiserver_cpu_percent: cpu_percent(api_before.cpu_ticks, api_after.cpu_ticks, ticks, window),
            apiserver_rss_mib: mib(api_after.rss_kib),
            agents_cpu_percent: cpu_percent(agents_before.cpu_ticks, agents_after.cpu_ticks, ticks, window),
            agents_rss_mib: mib(agents_after.rss_kib),
            connections_opened: attempts_after
                .iter()
                .zip(&attempts_before)
                .map(|(b, a)| b.saturating_sub(*a))
                .sum(),
            ..Idle::default()
        };

        // The outage, and the return, sampled every second.
        let apiserver_pid = AtomicU32::new(0);
        let stop = AtomicBool::new(false);
        let (counter, plane, progress, pinned) = (&self.counter, &mut self.plane, self.progress, self.pinned);
        let (samples, killed, ready) = std::thread::scope(|scope| -> anyhow::Result<_> {
            let sampler = scope.spawn(|| sample_every_second(counter, &pids, &apiserver_pid, &stop));
            let phases = (|| -> anyhow::Result<(Timestamp, Timestamp)> {
                progress.say(&format!(
                    "killing the API server for {}",
                    human_duration(options.outage)
                ));
                let killed = Timestamp::now();
                plane.kill_apiserver()?;
                sleep(options.outage);
                plane.restart_apiserver()?;
                // restart_apiserver returns at its first /readyz 200.
                let ready = Timestamp::now();
                pin_apiserver(plane, pinned)?;
                apiserver_pid.store(plane.apiserver_pid().unwrap_or(0), Ordering::Relaxed);
                wait_return(progress, agents, killed)?;
                Ok((killed, ready))
            })();
            stop.store(true, Ordering::Relaxed);
            let samples = sampler
                .join()
                .map_err(|_| anyhow::anyhow!("the sampler panicked"))?;
            let (killed, ready) = phases?;
            Ok((samples?, killed, ready))
        })?;
        Ok(Measured {
            result: SizeResult {
                agents: n,
                idle,
                outage: Outage {
                    down_s: ready.since(killed).as_secs_f64(),
                    ..Outage::default()
                },
                back: Return::default(),
            },
            idle: (idle_from, idle_to),
            killed,
            ready,
            samples,
            ticks,
        })
    }

    fn apiserver_sample(&self) -> anyhow::Result<procfs::ProcSample> {
        procfs::sample(
            self.plane
                .apiserver_pid()
                .context("the API server does not run")?,
        )
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        // The runtimes' sockets go with the work dir, when the plane drops.
        self.progress
            .say("stopping the fleet's runtimes and the control plane");
    }
}

fn pin_apiserver(plane: &ControlPlane, pinned: bool) -> anyhow::Result<()> {
    if let (true, Some(pid)) = (pinned, plane.apiserver_pid()) {
        pin(pid, 0)?;
    }
    Ok(())
}

/// Waits until every agent is synced again and has retired the checkpoints it activated
/// after `killed`, at least [`RETURN_WINDOW`] and at most [`RETURN_LIMIT`] (from now: the
/// API server's return).
fn wait_return(progress: Progress, agents: &mut [Agent], killed: Timestamp) -> anyhow::Result<()> {
    let started = Instant::now();
    let n = agents.len();
    loop {
        sleep(Duration::from_secs(2));
        let pending = agents
            .iter()
            .filter(|a| {
                let lines = analysis::log_lines(&a.log_text());
                let activated = analysis::first(&lines, Milestone::Activated, killed).is_some();
                // After the kill: an agent's probe may see the server back before the bench's.
                analysis::first(&lines, Milestone::Synced, killed).is_none()
                    || (activated && analysis::first(&lines, Milestone::Deactivated, killed).is_none())
            })
            .count();
        for agent in agents.iter_mut() {
            agent.ensure_running()?;
        }
        let waited = started.elapsed();
        if pending == 0 && waited >= RETURN_WINDOW {
            progress.say(&format!(
                "every agent ({n}) synced, and back to its parents if it had left them"
            ));
            return Ok(());
        }
        if waited >= RETURN_LIMIT {
            progress.say(&format!(
                "{pending} of {n} agents not yet synced or not back to their parents after {}",
                human_duration(waited)
            ));
            return Ok(());
        }
    }
}

/// The agents' summed footprint.
fn agents_sample(pids: &[u32]) -> anyhow::Result<procfs::ProcSample> {
    let mut total = procfs::ProcSample::default();
    for &pid in pids {
        let s = procfs::sample(pid)?;
        total.rss_kib += s.rss_kib;
        total.cpu_ticks += s.cpu_ticks;
        total.threads += s.threads;
    }
    Ok(total)
}

/// One look, each second of the outage and the return.
pub(crate) struct Sample {
    pub(crate) at: Timestamp,
    /// Each agent's connection attempts so far.
    pub(crate) attempts: Vec<u64>,
    /// The API server's CPU ticks so far (`None` while it is down).
    pub(crate) apiserver_ticks: Option<u64>,
    /// All agents' CPU ticks so far.
    pub(crate) agents_ticks: u64,
}

fn sample_every_second(
    counter: &ConnectionCounter,
    pids: &[u32],
    apiserver_pid: &AtomicU32,
    stop: &AtomicBool,
) -> anyhow::Result<Vec<Sample>> {
    let mut samples = Vec::new();
    let start = Instant::now();
    let mut next = start;
    while !stop.load(Ordering::Relaxed) {
        let pid = apiserver_pid.load(Ordering::Relaxed);
        samples.push(Sample {
            at: Timestamp::now(),
            attempts: counter.read()?,
            apiserver_ticks: (pid != 0)
                .then(|| procfs::sample(pid).ok().map(|s| s.cpu_ticks))
                .flatten(),
            agents_ticks: agents_sample(pids).map_or(0, |s| s.cpu_ticks),
        });
        next += Duration::from_secs(1);
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            sleep(wait);
        }
    }
    Ok(samples)
}

/// A size measured, before the logs are read.
struct Measured {
    result: SizeResult,
    /// The idle window.
    idle: (Timestamp, Timestamp),
    /// When the API server was killed, and first ready again.
    killed: Timestamp,
    ready: Timestamp,
    samples: Vec<Sample>,
    ticks: f64,
}

impl Measured {
    /// Fills in what the audit log and the agents' logs say.
    fn evaluate(&mut self, n: usize, requests: &[Request], logs: &[Vec<analysis::LogLine>]) {
        let r = &mut self.result;
        let (idle_from, idle_to) = self.idle;
        r.idle.requests = analysis::by_kind(analysis::within(requests, idle_from, idle_to));
        r.idle.requests_per_second = r.idle.requests.values().sum::<u64>() as f64 / r.idle.window_s;
        r.idle.requests_per_second_per_agent = r.idle.requests_per_second / n as f64;

        // The return's clock starts at the first `/readyz` 200, the bench's or an agent's.
        let killed = self.killed;
        let ready = (requests.iter())
            .filter(|q| q.at > killed && q.resource == "/readyz" && q.code == Some(200))
            .map(|q| q.at)
            .min()
            .map_or(self.ready, |first| first.min(self.ready));
        r.outage.down_s = ready.since(killed).as_secs_f64();
        // The outage runs from the last sample before the kill (the sampler starts first)
        // to the last one before the return; the return from there on.
        let last_before = |at: Timestamp| self.samples.iter().rposition(|s| s.at <= at).unwrap_or(0);
        let (kill_index, ready_index) = (last_before(killed), last_before(ready));
        let ready_index = ready_index.max(kill_index);
        let down: Vec<&Sample> = self
            .samples
            .get(kill_index..=ready_index)
            .unwrap_or_default()
            .iter()
            .collect();
        let down_attempts: Vec<Vec<u64>> = down.iter().map(|s| s.attempts.clone()).collect();
        let per_interval = analysis::attempts_per_interval(&down_attempts);
        r.outage.attempts_per_second = per_interval.iter().map(|(total, _)| *total).collect();
        r.outage.agents_per_second = per_interval.iter().map(|(_, agents)| *agents).collect();
        // Seeing the outage takes each agent a probe or two; the spread counts after that.
        let detected: Vec<f64> = (logs.iter())
            .filter_map(|lines| analysis::first(lines, Milestone::Unreachable, killed))
            .filter(|at| *at <= ready)
            .map(|at| at.since(killed).as_secs_f64())
            .collect();
        r.outage.detected = detected.len();
        r.outage.detection_s = super::stats::summarize(&detected);
        let all_detected = killed.saturating_add(Duration::from_secs_f64(
            r.outage.detection_s.map_or(0.0, |s| s.max),
        ));
        r.outage.max_agents_after_detection = (down.windows(2).zip(&per_interval))
            .filter(|(pair, _)| pair[0].at >= all_detected)
            .map(|(_, (_, agents))| *agents)
            .max()
            .unwrap_or(0);
        let down_secs = r.outage.down_s;
        let total: u64 = match (down.first(), down.last()) {
            (Some(first), Some(last)) => (last.attempts.iter())
                .zip(&first.attempts)
                .map(|(b, a)| b.saturating_sub(*a))
                .sum(),
            _ => 0,
        };
        r.outage.attempts = total;
        r.outage.attempts_per_agent_per_second = total as f64 / n as f64 / down_secs;
        let activations: Vec<f64> = (logs.iter())
            .filter_map(|lines| analysis::first(lines, Milestone::Activated, killed))
            .filter(|at| *at <= ready)
            .map(|at| at.since(killed).as_secs_f64())
            .collect();
        r.outage.activated = activations.len();
        r.outage.activation_s = super::stats::summarize(&activations);

        // The return's requests count from the restarted server's first answer of any
        // kind: a probe answered 403 while its authorizer loads lets an agent list.
        let answered = (requests.iter())
            .filter(|q| q.at > killed && q.code.is_some())
            .map(|q| q.at)
            .min()
            .map_or(ready, |first| first.min(ready));
        r.back.answered_before_ready_s = ready.since(answered).as_secs_f64();
        let window_end = answered.saturating_add(RETURN_WINDOW);
        let back: Vec<Request> = analysis::within(requests, answered, window_end)
            .cloned()
            .collect();
        r.back.per_second = analysis::per_second(&back, answered, RETURN_WINDOW.as_secs() as usize);
        if let Some((peak_second, peak)) = r.back.per_second.iter().enumerate().max_by_key(|(_, c)| **c) {
            r.back.peak = *peak;
            r.back.peak_second = peak_second;
            let from = answered.saturating_add(Duration::from_secs(peak_second as u64));
            let to = from.saturating_add(Duration::from_secs(1));
            r.back.peak_kinds = analysis::by_kind(analysis::within(&back, from, to));
        }
        r.back.kinds = analysis::by_kind(back.iter());
        r.back.http_429 = back.iter().filter(|q| q.code == Some(429)).count() as u64;
        r.back.http_403 = back.iter().filter(|q| q.code == Some(403)).count() as u64;
        let lists = analysis::lists_per_object(analysis::within(requests, killed, Timestamp::MAX));
        r.back.lists = lists.values().sum();
        r.back.objects_listed = lists.len();
        r.back.max_lists_per_object = lists.values().copied().max().unwrap_or(0);
        r.back.objects_listed_more_than_twice = lists.values().filter(|c| **c > 2).count();
        let since_ready = |milestone| -> Vec<f64> {
            (logs.iter())
                // Nothing syncs or retires while the server is down: the first after the
                // kill is the return's.
                .filter_map(|lines| analysis::first(lines, milestone, killed))
                .map(|at| at.since(ready).as_secs_f64())
                .collect()
        };
        let synced = since_ready(Milestone::Synced);
        r.back.synced = synced.len();
        r.back.synced_s = super::stats::summarize(&synced);
        let deactivated = since_ready(Milestone::Deactivated);
        r.back.deactivated = deactivated.len();
        r.back.deactivated_s = super::stats::summarize(&deactivated);
        // Per second after the return: new connections and the API server's CPU.
        let after: Vec<&Sample> = self.samples.iter().skip(ready_index).collect();
        let attempts: Vec<Vec<u64>> = after.iter().map(|s| s.attempts.clone()).collect();
        r.back.connections_per_second = (analysis::attempts_per_interval(&attempts).iter())
            .map(|(total, _)| *total)
            .collect();
        r.back.apiserver_cpu_percent = (after.windows(2))
            .filter_map(|pair| {
                let (a, b) = (pair[0].apiserver_ticks?, pair[1].apiserver_ticks?);
                let secs = pair[1].at.since(pair[0].at).as_secs_f64();
                Some(cpu_percent(a, b, self.ticks, secs))
            })
            .collect();
        r.back.agents_cpu_percent = (after.windows(2))
            .map(|pair| {
                let secs = pair[1].at.since(pair[0].at).as_secs_f64();
                cpu_percent(pair[0].agents_ticks, pair[1].agents_ticks, self.ticks, secs)
            })
            .collect();
    }
}

fn cpu_percent(before: u64, after: u64, ticks_per_second: f64, secs: f64) -> f64 {
    if secs <= 0.0 {
        return 0.0;
    }
    after.saturating_sub(before) as f64 / ticks_per_second / secs * 100.0
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The namespace, the agents' rights (the deployed rules, bound to [`FLEET_GROUP`]), the
/// agent's ServiceAccounts and its DaemonSet, whose owner reference every agent pod carries.
fn create_shared_objects(kubectl: &Kubectl) -> anyhow::Result<Owner> {
    let mut objects = agent_cluster_roles()?;
    objects.push(to_group(cluster_role_binding(
        AGENT_CLUSTER_ROLE,
        AGENT_CLUSTER_ROLE,
        "",
    )));
    objects.push(namespace(NS));
    kubectl.apply(&objects)?;
    kubectl.apply(&[
        to_group(role_binding(NS, "pod-checkpointer", AGENT_ROLE, "")),
        to_group(token_role_binding(NS, AGENT_TOKEN_ROLE, "")),
        service_account(NS, CHECKPOINTER_SERVICE_ACCOUNT),
        service_account(NS, STATIC_SERVICE_ACCOUNT),
    ])?;
    let ds = kubectl.create(&daemon_set(NS, CHECKPOINTER_SERVICE_ACCOUNT))?;
    Owner::of(&ds)
}

/// A binding made for a user, granted to the fleet's group instead.
fn to_group(mut binding: Value) -> Value {
    if let Some(subjects) = binding["subjects"].as_array_mut() {
        for subject in subjects.iter_mut().filter(|s| s["kind"] == "User") {
            *subject =
                json!({ "apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": FLEET_GROUP });
        }
    }
    binding
}

/// Nodes 1..=max with their Secret, ConfigMap and three pods, Running and Ready as their
/// kubelet would report them (the fake runtimes run the containers named here).
async fn create_nodes(client: &kube::Client, owner: &Owner, max: usize) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let post = PostParams::default();
    let now = Timestamp::now().to_rfc3339();
    for i in 1..=max {
        let names = NodeNames::of(i);
        let node = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": { "name": names.node, "labels": { "kubernetes.io/hostname": names.node } },
        });
        nodes.create(&post, &serde_json::from_value(node)?).await?;
        // What a kubelet reports and the agent reads (once an hour, else every minute).
        let info = json!({ "status": { "nodeInfo": {
            "kubeletVersion": KUBELET_VERSION, "machineID": "", "systemUUID": "", "bootID": "",
            "kernelVersion": "", "osImage": "", "containerRuntimeVersion": "fake://0",
            "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
        } } });
        nodes
            .patch_status(&names.node, &PatchParams::default(), &Patch::Merge(info))
            .await
            .with_context(|| format!("cannot set the status of node {}", names.node))?;
        let data = &names.node;
        secrets
            .create(
                &post,
                &serde_json::from_value(secret(NS, &format!("{data}-certs"), &[("tls.key", "fleet")]))?,
            )
            .await?;
        config_maps
            .create(
                &post,
                &serde_json::from_value(config_map(
                    NS,
                    &format!("{data}-config"),
                    &[("config.yaml", "fleet: true\n")],
                ))?,
            )
            .await?;
        let agent = PodBuilder::new(NS, &names.agent_pod, &names.node)
            .owned_by(owner)
            .label("app", CHECKPOINTER_SERVICE_ACCOUNT)
            .service_account(CHECKPOINTER_SERVICE_ACCOUNT)
            .checkpointed();
        let parents = names.parents.iter().map(|name| {
            PodBuilder::new(NS, name, &names.node)
                .checkpointed()
                .mount_secret(&format!("{data}-certs"))
                .mount_config_map(&format!("{data}-config"))
        });
        for pod in std::iter::once(agent).chain(parents) {
            let spec = pod.build();
            let name = spec["metadata"]["name"].as_str().unwrap_or_default().to_owned();
            pods.create(&post, &serde_json::from_value(spec)?)
                .await
                .with_context(|| format!("cannot create pod {NS}/{name}"))?;
            pods.patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(running_status(&name, &now)),
            )
            .await
            .with_context(|| format!("cannot set the status of pod {NS}/{name}"))?;
        }
    }
    Ok(())
}

/// A Running, Ready status whose one container (`main`, as [`PodBuilder`] names it) is the
/// one the fake runtime runs for the pod (`ctr-<ns>-<name>-0`).
fn running_status(name: &str, now: &str) -> Value {
    let condition = |kind: &str| json!({ "type": kind, "status": "True", "lastTransitionTime": now });
    json!({
        "status": {
            "phase": "Running",
            "startTime": now,
            "conditions": [condition("Initialized"), condition("ContainersReady"), condition("Ready"), condition("PodScheduled")],
            "containerStatuses": [{
                "name": "main",
                "image": "registry.invalid/never-pulled:1",
                "imageID": "",
                "containerID": format!("containerd://ctr-{NS}-{name}-0"),
                "ready": true,
                "started": true,
                "restartCount": 0,
                "state": { "running": { "startedAt": now } },
            }],
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_double_up_to_the_fleet() {
        let check = |n: usize, expected: &[usize]| assert_eq!(default_sizes(n), expected, "--fleet {n}");
        check(200, &[50, 100, 200]);
        check(300, &[50, 100, 200, 300]);
        check(400, &[50, 100, 200, 400]);
        check(50, &[50]);
        check(10, &[10]);
    }

    #[test]
    fn bindings_go_to_the_fleet_group() {
        let binding = to_group(role_binding(NS, "pod-checkpointer", AGENT_ROLE, "someone"));
        let subjects = binding["subjects"].as_array().unwrap();
        assert_eq!(subjects[0]["kind"], "Group");
        assert_eq!(subjects[0]["name"], FLEET_GROUP);
        // The ServiceAccounts stay.
        assert!(subjects[1..].iter().all(|s| s["kind"] == "ServiceAccount"));
    }
}
