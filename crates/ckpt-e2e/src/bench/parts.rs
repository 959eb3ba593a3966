//! The measured parts. Each runs its own agent in a namespace of its own, with checkpoint dirs
//! of its own, and cleans up behind it (agent stopped, checkpoints drained from the shared
//! static pod dir, its pods deleted) whether it succeeded or not.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime};

use crate::e2e_env::{AGENT_USER, CRI_SOCKET, NODE_NAME};
use crate::harness::agent::{Agent, AgentDirs};
use crate::harness::files_under;
use crate::harness::objects::PodBuilder;
use crate::interrupt;
use crate::progress::human_duration;
use crate::wait::{Probe, wait_for};
use anyhow::Context;

use super::audit::{self, ApiRequests, WatchesInWindow};
use super::procfs::{self, ProcSample};
use super::proxy::CountingProxy;
use super::stats::{PassHistogram, Samples, seconds};
use super::timing::{self, watch};
use super::utc::rfc3339_micros;
use super::{CheckpointPaths, Env, count_files};

/// How long one latency is waited for before the part fails.
const LATENCY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the hollow kubelet may take to start a pod; after a hung API server its pod
/// workers are stuck in API calls for a while.
const KUBELET_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the agent's view of a crash needs to be current: it polls the CRI every second.
const LOCAL_POLL_SETTLE: Duration = Duration::from_millis(1500);
/// The CRI watcher's interval: every look is a ListContainers on a new connection.
const CRI_POLL: Duration = Duration::from_millis(10);

/// Everything measured, filled in part by part.
#[derive(Default)]
pub(crate) struct Results {
    pub(crate) create_to_inactive: Samples,
    pub(crate) removed_immediate: Samples,
    pub(crate) removed_grace: Samples,
    pub(crate) hung_to_active: Samples,
    pub(crate) killed_to_active: Samples,
    pub(crate) running_to_deactivated: Samples,
    /// The outage agent's VmHWM (KiB) after its outages: its resident peak through every
    /// activation and deactivation, the figure a memory limit must leave room for.
    pub(crate) outage_hwm_kib: Option<u64>,
    pub(crate) idle: Option<Idle>,
    pub(crate) scale: Option<Scale>,
}

/// The idle window.
pub(crate) struct Idle {
    pub(crate) window: Duration,
    /// VmRSS once a second, KiB.
    pub(crate) rss_kib: Vec<f64>,
    pub(crate) before: ProcSample,
    pub(crate) after: ProcSample,
    /// utime + stime, from whole clock ticks.
    pub(crate) cpu_seconds: f64,
    /// The same to the nanosecond, from a cgroup of the agent's own (`None` where none
    /// could be made).
    pub(crate) cgroup_cpu_seconds: Option<f64>,
    pub(crate) api: ApiRequests,
    pub(crate) watches: WatchesInWindow,
    pub(crate) cri_calls: u64,
    pub(crate) kubelet_requests: u64,
    /// Checkpoint files (and the namespace's static pods) created, changed or removed.
    pub(crate) files_changed: Vec<String>,
    pub(crate) files_watched: usize,
    pub(crate) load: String,
}

impl Idle {
    /// Everything the agent asked of the API server in the window: probes, watches it
    /// opened, and every other request.
    pub(crate) fn api_requests_all_kinds(&self) -> u64 {
        self.api.resource_requests() + self.api.probes + self.watches.opened
    }
}

/// The scale part.
pub(crate) struct Scale {
    pub(crate) pods: usize,
    /// Creating them all, one request after the other.
    pub(crate) create: Duration,
    /// First create request → the last inactive checkpoint on disk.
    pub(crate) all_checkpointed: Duration,
    pub(crate) after: ProcSample,
    pub(crate) cpu_seconds: f64,
    /// Passes from the first create until 10 s after the last checkpoint.
    pub(crate) passes: PassHistogram,
    pub(crate) running_on_node: usize,
    /// Agent started with the pods already there → all checkpointed (fresh dirs each time).
    pub(crate) cold_start: Samples,
    pub(crate) cold_start_rss_kib: Vec<u64>,
    pub(crate) load: String,
}

/// Pod created → inactive checkpoint; parent deleted → checkpoint removed (immediate).
pub(crate) fn checkpoint(env: &mut Env, reps: usize, results: &mut Results) -> anyhow::Result<()> {
    let mut removed = Samples::default();
    gc_part(env, reps, "checkpoint", "immediate", None, results, &mut removed)?;
    results.removed_immediate = removed;
    Ok(())
}

/// The same with a 2 s grace period.
pub(crate) fn grace(env: &mut Env, reps: usize, results: &mut Results) -> anyhow::Result<()> {
    let mut removed = Samples::default();
    gc_part(
        env,
        reps,
        "grace",
        "grace-period",
        Some("2s"),
        results,
        &mut removed,
    )?;
    results.removed_grace = removed;
    Ok(())
}

fn gc_part(
    env: &mut Env,
    reps: usize,
    part: &str,
    strategy: &str,
    grace: Option<&str>,
    results: &mut Results,
    removed: &mut Samples,
) -> anyhow::Result<()> {
    let ns = env.namespace(part)?;
    let self_pod = env.testbed.create_checkpointer_pod(&ns)?.name;
    let dirs = env.dirs(part)?;
    let mut config = env.testbed.agent_config(part, &ns, &self_pod, &dirs);
    config.gc_strategy = Some(strategy.to_owned());
    config.grace_period = grace.map(str::to_owned);
    env.progress.say(&format!(
        "agent with --gc-strategy {strategy}{}; {reps} parents, each created, run by the kubelet, then deleted",
        grace.map(|g| format!(" --checkpoint-grace-period {g}")).unwrap_or_default()
    ));
    let mut agent = env.start_agent(&config)?;
    let outcome = (|| {
        let client = env.api_client()?;
        for i in 1..=reps {
            let name = format!("parent-{i}");
            let paths = CheckpointPaths::of(&dirs, &ns, &name);

            let inactive = paths.inactive.clone();
            let written = watch(&format!("the inactive checkpoint of {ns}/{name}"), move || {
                inactive.exists()
            });
            let mark = Instant::now();
            env.create_pod(&client, &env.parent(&ns, &name).build())?;
            let created = written.wait_since(mark, LATENCY_TIMEOUT)?;

            // A parent runs before it is deleted; this also lets the checkpoint's data land.
            wait_running(env, &ns, &name)?;
            let gone = watch(&format!("the checkpoint of {ns}/{name} removed"), move || {
                paths.gone()
            });
            let mark = Instant::now();
            env.delete_pod_now(&client, &ns, &name)?;
            let removal = gone.wait_since(mark, LATENCY_TIMEOUT)?;

            agent.ensure_running()?;
            env.progress.say(&format!(
                "{part} {i}/{reps}: created → inactive checkpoint {}; deleted → removed {}",
                seconds(created.as_secs_f64()),
                seconds(removal.as_secs_f64())
            ));
            results.create_to_inactive.push(created);
            removed.push(removal);
        }
        Ok(())
    })();
    finish(env, outcome, Some(&mut agent), &[dirs], &ns)
}

/// API server hung (SIGSTOP) or killed (SIGKILL) with the parent crashed → checkpoint active;
/// API server back, the parent re-created and running → checkpoint deactivated. Hung and
/// killed alternate, `reps` each; one parent throughout.
pub(crate) fn outage(env: &mut Env, reps: usize, results: &mut Results) -> anyhow::Result<()> {
    const PARENT: &str = "kube-apiserver";
    let ns = env.namespace("outage")?;
    let self_pod = env.testbed.create_checkpointer_pod(&ns)?.name;
    let parent = env.parent(&ns, PARENT).restart_never();
    env.testbed.kubectl.create(&parent.build())?;
    wait_running(env, &ns, PARENT)?;
    let dirs = env.dirs("outage")?;
    let config = env.testbed.agent_config("outage", &ns, &self_pod, &dirs);
    env.progress.say(&format!(
        "agent with the default GC (grace period 1 m, so re-creating the parent keeps the checkpoint); parent {ns}/{PARENT} with restartPolicy Never"
    ));
    let mut agent = env.start_agent(&config)?;
    let paths = CheckpointPaths::of(&dirs, &ns, PARENT);
    let outcome = (|| {
        wait_for("the parent's inactive checkpoint", LATENCY_TIMEOUT, || {
            Ok(if paths.inactive.exists() {
                Probe::Ready(())
            } else {
                Probe::Waiting("not yet".into())
            })
        })?;
        for i in 0..2 * reps {
            let hung = i % 2 == 0;
            let kind = if hung {
                "hung (SIGSTOP)"
            } else {
                "killed (SIGKILL)"
            };
            // The parent's containers crash; with the API server up nothing is activated.
            env.testbed.cri.stop_pod(&ns, PARENT)?;
            env.testbed.expect().kubelet_stopped(&ns, PARENT)?;
            sleep(LOCAL_POLL_SETTLE);
            anyhow::ensure!(
                !paths.active.exists(),
                "the checkpoint was activated while the API server answered"
            );

            let active = paths.active.clone();
            let activated = watch("the active checkpoint (static pod)", move || active.exists());
            let mark = Instant::now();
            if hung {
                env.testbed.pause_apiserver()?;
            } else {
                env.testbed.kill_apiserver()?;
            }
            let activation = activated.wait_since(mark, LATENCY_TIMEOUT);
            let recovery = if hung {
                env.testbed.resume_apiserver()
            } else {
                env.testbed.restart_apiserver().map(drop)
            };
            let activation = activation?;
            recovery?;
            agent.wait_api_state("synced")?;

            // The parent's controller re-creates it; the kubelet runs it; the checkpoint is
            // deactivated. Timed from the first sight of the parent running in the CRI.
            env.testbed.kubectl.delete_now("pod", &ns, PARENT)?;
            env.testbed.expect().api_pod_gone(&ns, PARENT)?;
            let (cri, cri_ns) = (env.testbed.cri.clone(), ns.clone());
            let runs = timing::watch_every("the re-created parent running in the CRI", CRI_POLL, move || {
                cri.is_running(&cri_ns, PARENT).unwrap_or(false)
            });
            let active = paths.active.clone();
            let deactivated = watch("the active checkpoint removed (deactivation)", move || {
                !active.exists()
            });
            let mark = Instant::now();
            env.testbed.kubectl.create(&parent.build())?;
            let ran = runs.wait_with_progress(mark, KUBELET_TIMEOUT, || {
                Some("waiting for the hollow kubelet to run the re-created parent".into())
            })?;
            let gone = deactivated.wait_since(mark, KUBELET_TIMEOUT + LATENCY_TIMEOUT)?;
            // Both are first sights at ≤10 ms resolution; a deactivation seen first counts as 0.
            let deactivation = gone.saturating_sub(ran);
            anyhow::ensure!(
                paths.inactive.exists(),
                "the checkpoint was removed, not deactivated"
            );
            agent.ensure_running()?;
            env.progress.say(&format!(
                "outage {}/{}: API server {kind} → active {}; parent running again (after {}) → deactivated {}",
                i + 1,
                2 * reps,
                seconds(activation.as_secs_f64()),
                human_duration(ran),
                seconds(deactivation.as_secs_f64())
            ));
            if hung {
                results.hung_to_active.push(activation);
            } else {
                results.killed_to_active.push(activation);
            }
            results.running_to_deactivated.push(deactivation);
        }
        results.outage_hwm_kib = Some(procfs::sample(agent.pid())?.hwm_kib);
        Ok(())
    })();
    finish(env, outcome, Some(&mut agent), &[dirs], &ns)
}

/// The idle footprint: one agent with itself and one parent (with a Secret and a ConfigMap)
/// to look after, its CRI and kubelet traffic through counting proxies, over `window`.
pub(crate) fn idle(env: &mut Env, window: Duration, results: &mut Results) -> anyhow::Result<()> {
    const PARENT: &str = "kube-apiserver";
    // Past the minute after which the running parent's content is known-good (one journal
    // write, a change of state): the window then holds only what an idle node costs.
    const SETTLE: Duration = ckpt_core::KNOWN_GOOD_AFTER.saturating_add(Duration::from_secs(10));
    let ns = env.namespace("idle")?;
    let self_pod = env.testbed.create_checkpointer_pod(&ns)?.name;
    env.testbed.kubectl.create(&env.parent(&ns, PARENT).build())?;
    let dirs = env.dirs("idle")?;
    let cri = CountingProxy::grpc_unix(
        &env.dir.join(format!("cri-proxy{}.sock", env.variant)),
        Path::new(CRI_SOCKET),
    )?;
    let kubelet_addr: SocketAddr = env
        .testbed
        .kubelet_url()
        .trim_start_matches("http://")
        .parse()
        .context("the kubelet URL is not http://IP:PORT")?;
    let kubelet = CountingProxy::http_tcp(kubelet_addr)?;
    let mut config = env.testbed.agent_config("idle", &ns, &self_pod, &dirs);
    config.runtime_endpoint = cri.endpoint.clone();
    config.kubelet_url = kubelet.endpoint.clone();
    env.progress.say("agent with its own pod and one parent (a Secret and a ConfigMap), CRI and kubelet through counting proxies");
    let audit_log = env.testbed.plane.audit_log();
    let audit_before_agent = audit::log_len(&audit_log)?;
    let mut agent = env.start_agent(&config)?;
    let outcome = (|| {
        let paths = CheckpointPaths::of(&dirs, &ns, PARENT);
        wait_for("the parent checkpointed and running", KUBELET_TIMEOUT, || {
            let running = env.testbed.cri.is_running(&ns, PARENT).unwrap_or(false);
            Ok(if running && paths.inactive.exists() {
                Probe::Ready(())
            } else {
                Probe::Waiting(format!(
                    "running: {running}, checkpoint: {}",
                    paths.inactive.exists()
                ))
            })
        })?;
        env.progress.say(&format!(
            "letting it settle for {}, then measuring for {}",
            human_duration(SETTLE),
            human_duration(window)
        ));
        sleep(SETTLE);

        let pid = agent.pid();
        let account = procfs::CpuAccount::enter(pid, "pod-checkpointer-bench-idle");
        let files_before = file_states(&dirs, &ns);
        let (audit_from, cri_from, kubelet_from) =
            (audit::log_len(&audit_log)?, cri.requests(), kubelet.requests());
        let before = procfs::sample(pid)?;
        let account_before = account.as_ref().map(procfs::CpuAccount::usage_ns).transpose()?;
        let (started, window_start) = (Instant::now(), SystemTime::now());
        let mut rss_kib = Vec::new();
        let mut next_progress = Duration::from_secs(30);
        while started.elapsed() < window {
            interrupt::check()?;
            rss_kib.push(procfs::sample(pid)?.rss_kib as f64);
            if started.elapsed() >= next_progress {
                env.progress.say(&format!(
                    "idle {} of {}: VmRSS {} KiB, {} API requests (audit), {} CRI calls so far",
                    human_duration(started.elapsed()),
                    human_duration(window),
                    rss_kib.last().copied().unwrap_or(0.0),
                    audit::requests_between(&audit_log, audit_from, audit::log_len(&audit_log)?, AGENT_USER)?
                        .resource_requests(),
                    cri.requests() - cri_from
                ));
                next_progress += Duration::from_secs(30);
            }
            let next = Duration::from_secs(rss_kib.len() as u64);
            sleep(next.saturating_sub(started.elapsed()).min(Duration::from_secs(1)));
        }
        let after = procfs::sample(pid)?;
        let account_after = account.as_ref().map(procfs::CpuAccount::usage_ns).transpose()?;
        let (measured, window_end) = (started.elapsed(), SystemTime::now());
        let (audit_to, cri_to, kubelet_to) =
            (audit::log_len(&audit_log)?, cri.requests(), kubelet.requests());
        let files_after = file_states(&dirs, &ns);
        agent.ensure_running()?;
        // The API server logs a quiet watch only when it ends: stopping the agent ends them.
        agent.stop()?;
        sleep(Duration::from_secs(1));
        let spans = audit::watches_between(
            &audit_log,
            audit_before_agent,
            audit::log_len(&audit_log)?,
            AGENT_USER,
        )?;
        let watches =
            audit::watches_in_window(&spans, &rfc3339_micros(window_start), &rfc3339_micros(window_end));

        let ticks = procfs::clock_ticks_per_second() as f64;
        let idle = Idle {
            window: measured,
            rss_kib,
            before,
            after,
            cpu_seconds: (after.cpu_ticks - before.cpu_ticks) as f64 / ticks,
            cgroup_cpu_seconds: account_before
                .zip(account_after)
                .map(|(from, to)| to.saturating_sub(from) as f64 / 1e9),
            api: audit::requests_between(&audit_log, audit_from, audit_to, AGENT_USER)?,
            watches,
            cri_calls: cri_to - cri_from,
            kubelet_requests: kubelet_to - kubelet_from,
            files_changed: changed_files(&files_before, &files_after),
            files_watched: files_before.len(),
            load: procfs::load_average(),
        };
        env.progress.say(&format!(
            "idle: VmRSS {} KiB (VmHWM {} KiB), {:.2} s CPU, {} API requests besides watches and probes, {} probes, {} CRI calls, {} kubelet requests, {} files changed",
            idle.after.rss_kib,
            idle.after.hwm_kib,
            idle.cpu_seconds,
            idle.api.resource_requests(),
            idle.api.probes,
            idle.cri_calls,
            idle.kubelet_requests,
            idle.files_changed.len()
        ));
        results.idle = Some(idle);
        Ok(())
    })();
    finish(env, outcome, Some(&mut agent), &[dirs], &ns)
}

/// `pods` annotated pods created on the node while the agent runs → all checkpointed; then
/// `cold_starts` agents started with them already there.
pub(crate) fn scale(
    env: &mut Env,
    pods: usize,
    cold_starts: usize,
    results: &mut Results,
) -> anyhow::Result<()> {
    const SETTLE: Duration = Duration::from_secs(10);
    let ns = env.namespace("scale")?;
    let self_pod = env.testbed.create_checkpointer_pod(&ns)?.name;
    let dirs = env.dirs("scale")?;
    let config = env.testbed.agent_config("scale", &ns, &self_pod, &dirs);
    env.progress.say(&format!(
        "agent with its own pod; creating {pods} annotated pods on {NODE_NAME}"
    ));
    let mut agent = env.start_agent(&config)?;
    let mut all_dirs = vec![dirs.clone()];
    let prefix = format!("{ns}_p-");
    let outcome = (|| {
        let client = env.api_client()?;
        let inactive_dir = dirs.checkpoint_dir.join("inactive-manifests");
        let (dir, wanted) = (inactive_dir.clone(), prefix.clone());
        let all = watch(&format!("{pods} inactive checkpoints"), move || {
            count_files(&dir, &wanted) >= pods
        });
        let before = procfs::sample(agent.pid())?;
        let passes_before = pass_histogram(&agent)?;
        let mark = Instant::now();
        for i in 0..pods {
            interrupt::check()?;
            let pod = PodBuilder::new(&ns, &format!("p-{i:03}"), NODE_NAME)
                .checkpointed()
                .build();
            env.create_pod(&client, &pod)?;
            if (i + 1) % 50 == 0 {
                env.progress.say(&format!(
                    "created {} of {pods} pods; {} checkpointed",
                    i + 1,
                    count_files(&inactive_dir, &prefix)
                ));
            }
        }
        let create = mark.elapsed();
        let all_checkpointed = all.wait_with_progress(mark, Duration::from_secs(300), || {
            Some(format!(
                "{} of {pods} checkpointed",
                count_files(&inactive_dir, &prefix)
            ))
        })?;
        env.progress.say(&format!(
            "all {pods} checkpointed {} after the first create (creating took {}); settling {}",
            human_duration(all_checkpointed),
            human_duration(create),
            human_duration(SETTLE)
        ));
        sleep(SETTLE);
        let after = procfs::sample(agent.pid())?;
        let passes = pass_histogram(&agent)?.since(&passes_before);
        let running_on_node = env
            .testbed
            .cri
            .running_pods()?
            .iter()
            .filter(|p| p.starts_with(&format!("{ns}/p-")))
            .count();
        agent.stop()?;

        let mut cold_start = Samples::default();
        let mut cold_start_rss_kib = Vec::new();
        for r in 1..=cold_starts {
            let cold_dirs = env.dirs(&format!("scale-cold-{r}"))?;
            all_dirs.push(cold_dirs.clone());
            let config = env
                .testbed
                .agent_config(&format!("scale-cold-{r}"), &ns, &self_pod, &cold_dirs);
            let (dir, wanted) = (
                cold_dirs.checkpoint_dir.join("inactive-manifests"),
                prefix.clone(),
            );
            let all = watch(&format!("{pods} inactive checkpoints"), move || {
                count_files(&dir, &wanted) >= pods
            });
            let mark = Instant::now();
            let mut cold = Agent::start_with_log_filter(
                &env.testbed.agent_bin,
                &config,
                &env.dir,
                super::AGENT_LOG_LEVEL,
            )?;
            let took = all.wait_since(mark, Duration::from_secs(300))?;
            let rss = procfs::sample(cold.pid())?.rss_kib;
            cold.stop()?;
            env.progress.say(&format!(
                "cold start {r}/{cold_starts}: agent started → {pods} checkpointed {}; VmRSS then {rss} KiB",
                seconds(took.as_secs_f64())
            ));
            cold_start.push(took);
            cold_start_rss_kib.push(rss);
        }
        let ticks = procfs::clock_ticks_per_second() as f64;
        results.scale = Some(Scale {
            pods,
            create,
            all_checkpointed,
            after,
            cpu_seconds: (after.cpu_ticks - before.cpu_ticks) as f64 / ticks,
            passes,
            running_on_node,
            cold_start,
            cold_start_rss_kib,
            load: procfs::load_average(),
        });
        Ok(())
    })();
    finish(env, outcome, Some(&mut agent), &all_dirs, &ns)
}

/// Cleans up after a part; the part's error comes first.
fn finish(
    env: &Env,
    outcome: anyhow::Result<()>,
    agent: Option<&mut Agent>,
    dirs: &[AgentDirs],
    ns: &str,
) -> anyhow::Result<()> {
    if outcome.is_err()
        && let Some(agent) = &agent
    {
        eprintln!(
            "--- last lines of {} ---\n{}",
            agent.log_path().display(),
            agent.log_tail(30)
        );
    }
    let cleaned = env.clean_up(agent, dirs, ns);
    outcome?;
    cleaned.context("cleaning up after the part")
}

/// Waits (untimed) until the kubelet runs `ns/name`.
fn wait_running(env: &Env, ns: &str, name: &str) -> anyhow::Result<()> {
    env.testbed
        .expect()
        .kubelet_runs(ns, name, KUBELET_TIMEOUT)
        .map(drop)
}

fn pass_histogram(agent: &Agent) -> anyhow::Result<PassHistogram> {
    let (code, page) = agent.http_get("/metrics")?;
    anyhow::ensure!(code == 200, "/metrics answered {code}");
    PassHistogram::parse(&page).context("no pass-duration histogram in /metrics")
}

/// Modification time and size of the agent's files: its checkpoint dir and the namespace's
/// static pods.
fn file_states(dirs: &AgentDirs, ns: &str) -> BTreeMap<String, (SystemTime, u64)> {
    let mut states = BTreeMap::new();
    let mut add = |root: &Path, relative: String| {
        if let Ok(meta) = std::fs::metadata(root.join(&relative)) {
            let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            states.insert(root.join(&relative).display().to_string(), (modified, meta.len()));
        }
    };
    for file in files_under(&dirs.checkpoint_dir) {
        add(&dirs.checkpoint_dir, file);
    }
    for file in files_under(&dirs.manifests_dir) {
        if file.starts_with(&format!("{ns}_")) {
            add(&dirs.manifests_dir, file);
        }
    }
    states
}

fn changed_files(
    before: &BTreeMap<String, (SystemTime, u64)>,
    after: &BTreeMap<String, (SystemTime, u64)>,
) -> Vec<String> {
    let mut changed: Vec<String> = after
        .iter()
        .filter(|(path, state)| before.get(*path) != Some(state))
        .map(|(path, _)| path.clone())
        .collect();
    changed.extend(before.keys().filter(|p| !after.contains_key(*p)).cloned());
    changed
}
