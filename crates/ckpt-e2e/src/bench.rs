//! `cargo xtask bench`: the end-to-end benchmarks (issue 9). The agent as the image ships it
//! (the static musl release build) runs as a
//! process against the real control plane (kube-apiserver v1.37.2 or v1.20.2, etcd, kubemark's hollow
//! kubelet, see `e2e_env`), driven by the e2e harness, and every target (ARCHITECTURE.md, Targets) that needs a
//! real API server and kubelet is measured over repetitions:
//!
//! - `checkpoint`: annotated pod created → inactive checkpoint on disk; parent deleted →
//!   checkpoint removed (`--gc-strategy immediate`);
//! - `grace`: the same with `--gc-strategy grace-period --checkpoint-grace-period 2s`;
//! - `outage`: API server SIGSTOPped / SIGKILLed → checkpoint active; API server back and
//!   the parent running again → checkpoint deactivated;
//! - `idle`: RSS, CPU, disk writes and requests to the API server (its audit log), the CRI
//!   and the kubelet (counting proxies) over an idle window;
//! - `scale`: 200 annotated pods on the node → all checkpointed, RSS, pass duration.
//!
//! `--fleet N` measures instead what N agents cost one API server (see `fleet`).
//!
//! Latencies are taken from observable events: a watcher thread started before the action
//! polls the file (or the CRI) every 5 ms, and the latency runs from a mark taken just before
//! the action (the API request, the signal) to the watcher's first sight. Results go to
//! `target/bench/e2e-<timestamp>.{json,md}`. CI never runs this (it only compiles xtask).

mod audit;
mod fleet;
mod parts;
mod procfs;
mod proxy;
mod report;
pub mod stats;
mod timing;
mod utc;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use crate::command::{run_command, run_on_terminal};
use crate::e2e_env::{self, ControlPlane, StartOptions};
use crate::harness::agent::{Agent, AgentConfig, AgentDirs};
use crate::harness::objects::PodBuilder;
use crate::harness::testbed::{AGENT_ROLE, Testbed, parent_with_data};
use crate::interrupt;
use crate::process::random_hex;
use crate::progress::Progress;
use crate::progress::human_duration;
use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::Value;

/// Measure latency, footprint and API load of the release agent against the real control
/// plane and hollow kubelet; writes target/bench/e2e-<timestamp>.{json,md}.
/// POD_CHECKPOINTER_BIN=PATH measures that build of the agent instead of building one.
#[derive(clap::Args)]
pub struct Bench {
    /// Repetitions of each latency measurement.
    #[arg(long, default_value_t = 10)]
    reps: usize,
    /// Run only these parts (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Part>,
    /// Length of the idle window.
    #[arg(long, default_value_t = 120)]
    idle_secs: u64,
    /// Annotated pods created for the scale part.
    #[arg(long, default_value_t = 200)]
    scale_pods: usize,
    /// Cold starts of an agent with the scale part's pods already there.
    #[arg(long, default_value_t = 3)]
    scale_reps: usize,
    /// Use the control plane `cargo xtask e2e-env start --hollow-node` left running in this
    /// work dir instead of starting one (it is left running).
    #[arg(long)]
    workdir: Option<PathBuf>,
    /// Also measure the agent built from this git revision (a commit, a tag, `HEAD~1`) on the
    /// same plane in the same run, after the build under test, and compare the two side by
    /// side. The baseline's binary is cached by commit in the target dir.
    #[arg(long, value_name = "REV")]
    baseline: Option<String>,
    /// The Kubernetes release of the control plane and hollow kubelet (`1.20`: Debian's
    /// source build).
    #[arg(long, value_enum, default_value = "1.37")]
    kubernetes: e2e_env::Release,
    /// Instead of the parts above: N agents (default 200), each for its own node, against
    /// one API server, at idle, through a 60 s outage and at its return, measured at 50,
    /// 100, 200, … up to N; writes target/bench/fleet-<timestamp>.{json,md,png}.
    #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = "200")]
    fleet: Option<usize>,
    /// The fleet sizes to measure instead of the doubling series up to N.
    #[arg(long, value_delimiter = ',', requires = "fleet")]
    fleet_sizes: Vec<usize>,
    /// How long the fleet's API server stays down.
    #[arg(long, default_value_t = 60, requires = "fleet")]
    outage_secs: u64,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Part {
    /// Pod created → inactive checkpoint; parent deleted → removed (immediate GC).
    Checkpoint,
    /// Parent deleted → removed with a 2 s grace period.
    Grace,
    /// API server hung or killed → active; parent running again → deactivated.
    Outage,
    /// Idle footprint and request rates.
    Idle,
    /// Many annotated pods on the node.
    Scale,
}

const ALL_PARTS: [Part; 5] = [
    Part::Idle,
    Part::Checkpoint,
    Part::Grace,
    Part::Outage,
    Part::Scale,
];

/// The agent's log level in the benchmarks: its production default.
const AGENT_LOG_LEVEL: &str = "info";
/// The report's name for the default build under test.
const SHIPPED_AGENT: &str = "the image's static build (x86_64-unknown-linux-musl, release profile, stripped)";

impl Bench {
    pub fn run(&self) -> anyhow::Result<()> {
        if let Some(n) = self.fleet {
            let mut sizes = if self.fleet_sizes.is_empty() {
                fleet::default_sizes(n)
            } else {
                self.fleet_sizes.clone()
            };
            sizes.sort_unstable();
            sizes.dedup();
            let options = fleet::FleetOptions {
                sizes,
                idle: Duration::from_secs(self.idle_secs),
                outage: Duration::from_secs(self.outage_secs),
                kubernetes: self.kubernetes,
            };
            return interrupt::run(
                Progress::new("bench"),
                "the agents and the control plane are stopped",
                || fleet::run(&options),
            );
        }
        anyhow::ensure!(self.reps > 0, "--reps must be at least 1");
        interrupt::run(
            Progress::new("bench"),
            "the agents are stopped, and the control plane if the bench started it",
            || self.bench(),
        )
    }

    fn bench(&self) -> anyhow::Result<()> {
        let started = Instant::now();
        let started_at = SystemTime::now();
        let progress = Progress::timed("bench");
        let parts: Vec<Part> = ALL_PARTS
            .into_iter()
            .filter(|p| self.only.is_empty() || self.only.contains(p))
            .collect();
        progress.say("building the control plane's binaries (cached) and the agent as the image ships it");
        let bins = e2e_env::ensure_built_release(self.kubernetes)?;
        let target_dir = crate::image::target_dir();
        // Before the build under test: both builds leave their binary at the same path.
        let baseline = match &self.baseline {
            Some(rev) => Some(baseline_agent(rev, &target_dir, &progress)?),
            None => None,
        };
        let (agent_bin, agent) = match std::env::var_os("POD_CHECKPOINTER_BIN").filter(|p| !p.is_empty()) {
            // Another build of the agent (a profile or runtime variant) measured the same way.
            Some(path) => {
                let agent = format!("POD_CHECKPOINTER_BIN={}", path.to_string_lossy());
                (PathBuf::from(path), agent)
            }
            // What operators run: the image's static (musl) release build, not a glibc one
            // (whose shared libraries alone map ~2 MiB more).
            None => (crate::image::build_static_agent()?, SHIPPED_AGENT.to_owned()),
        };
        anyhow::ensure!(agent_bin.is_file(), "{} was not built", agent_bin.display());

        // The agent as built now: the shared tree may change while the bench runs.
        let commit = git_commit();
        let build_time = started.elapsed();
        let load_before = procfs::load_average();
        let plane = match &self.workdir {
            Some(dir) => ControlPlane::attach(dir)?,
            None => ControlPlane::start(&StartOptions {
                hollow_node: true,
                ..StartOptions::new(bins)
            })?,
        };
        let mut env = Env::new(Testbed::new(plane, agent_bin.clone())?, progress)?;
        let mut failures = Vec::new();
        let results = self.run_parts(&mut env, &parts, &mut failures)?;
        let baseline = match baseline {
            Some((commit, bin)) => {
                env.progress.say(&format!(
                    "=== the same parts with the baseline, {commit} ({}) ===",
                    bin.display()
                ));
                env.testbed.agent_bin = bin;
                env.variant = "-baseline".into();
                let mut base_failures = Vec::new();
                let base = self.run_parts(&mut env, &parts, &mut base_failures)?;
                env.testbed.agent_bin = agent_bin;
                failures.extend(base_failures.into_iter().map(|f| format!("baseline {f}")));
                Some(report::Baseline {
                    commit,
                    results: base,
                })
            }
            None => None,
        };
        let run = report::Run {
            started_at,
            command: command_line(),
            commit,
            machine: procfs::machine(),
            load_before,
            load_after: procfs::load_average(),
            duration: started.elapsed() - build_time,
            reps: self.reps,
            failures: failures.clone(),
            kubernetes: self.kubernetes,
            agent,
        };
        let (json, md) = report::write(
            &crate::project_root().join("target/bench"),
            &run,
            &results,
            baseline.as_ref(),
        )?;
        eprintln!("{}", fs::read_to_string(&md).unwrap_or_default());
        progress.say(&format!(
            "done in {} (plus {} building); results in {} and {}",
            human_duration(run.duration),
            human_duration(build_time),
            json.display(),
            md.display()
        ));
        drop(env);
        anyhow::ensure!(failures.is_empty(), "some parts failed:\n{}", failures.join("\n"));
        Ok(())
    }
}

impl Bench {
    /// Runs `parts` with the testbed's agent; a failed part is reported in `failures` and
    /// the next one runs.
    fn run_parts(
        &self,
        env: &mut Env,
        parts: &[Part],
        failures: &mut Vec<String>,
    ) -> anyhow::Result<parts::Results> {
        let mut results = parts::Results::default();
        for part in parts.iter().copied() {
            interrupt::check()?;
            env.progress.say(&format!("=== {} ===", part_name(part)));
            let outcome = match part {
                Part::Checkpoint => parts::checkpoint(env, self.reps, &mut results),
                Part::Grace => parts::grace(env, self.reps, &mut results),
                Part::Outage => parts::outage(env, self.reps, &mut results),
                Part::Idle => parts::idle(env, Duration::from_secs(self.idle_secs), &mut results),
                Part::Scale => parts::scale(env, self.scale_pods, self.scale_reps, &mut results),
            };
            if let Err(e) = outcome {
                interrupt::check()?;
                env.progress.say(&format!("{} FAILED: {e:#}", part_name(part)));
                failures.push(format!("{}: {e:#}", part_name(part)));
                // A failed outage part may leave the API server paused or dead.
                env.testbed.recover_apiserver()?;
            }
        }
        Ok(results)
    }
}

/// The agent built from `rev` as its image ships it (static, musl): its short commit and
/// binary. Built once per commit in a temporary git worktree, with the static builds'
/// target dir (dependencies are shared), and kept in `TARGET/bench-baselines-static`.
fn baseline_agent(rev: &str, target_dir: &Path, progress: &Progress) -> anyhow::Result<(String, PathBuf)> {
    let commit = git(&[
        "rev-parse",
        "--verify",
        "--end-of-options",
        &format!("{rev}^{{commit}}"),
    ])
    .with_context(|| format!("--baseline {rev}: not a commit of this repository"))?;
    let short = git(&["rev-parse", "--short", &commit])?;
    let cache = target_dir.join("bench-baselines-static");
    let bin = cache.join(format!("pod-checkpointer-{commit}"));
    if bin.is_file() {
        progress.say(&format!("baseline {short}: {} (cached)", bin.display()));
        return Ok((short, bin));
    }
    progress.say(&format!(
        "baseline {short}: building its static agent (as its image ships it) in a git worktree"
    ));
    let src = cache.join(format!("src-{commit}"));
    if src.exists() {
        // Left by an interrupted build.
        let _ = git(&["worktree", "remove", "--force", &src.to_string_lossy()]);
        let _ = fs::remove_dir_all(&src);
    }
    fs::create_dir_all(&cache).with_context(|| format!("cannot create {}", cache.display()))?;
    git(&["worktree", "add", "--detach", &src.to_string_lossy(), &commit])?;
    crate::image::static_toolchain(crate::image::Arch::Amd64)?;
    let (mut cargo, built_bin) = crate::image::static_build(crate::image::Arch::Amd64, &src);
    let built = run_on_terminal(&mut cargo).with_context(|| format!("building the baseline {short} failed"));
    // The worktree goes whether or not the build worked.
    let kept = built.and_then(|()| {
        let partial = cache.join(format!(".pod-checkpointer-{commit}.partial"));
        fs::copy(&built_bin, &partial)
            .and_then(|_| fs::rename(&partial, &bin))
            .with_context(|| format!("cannot keep the baseline binary as {}", bin.display()))
    });
    git(&["worktree", "remove", "--force", &src.to_string_lossy()])?;
    kept?;
    Ok((short, bin))
}

pub(crate) fn part_name(part: Part) -> &'static str {
    match part {
        Part::Checkpoint => "checkpoint",
        Part::Grace => "grace",
        Part::Outage => "outage",
        Part::Idle => "idle",
        Part::Scale => "scale",
    }
}

fn command_line() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!("cargo xtask {}", args.join(" "))
}

/// `git describe`-like: the short commit, `+dirty` when the tree has changes (the shared tree
/// often has other people's work in progress, which is not in the agent unless under crates/).
fn git_commit() -> String {
    let (commit, agent_dirty) = git_head();
    if agent_dirty {
        format!("{commit} (+ uncommitted changes under crates/ or Cargo.*)")
    } else {
        commit
    }
}

/// The short commit, and whether the agent's or the suite's sources (crates/, Cargo.*)
/// have uncommitted changes.
pub fn git_head() -> (String, bool) {
    let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_default();
    let agent_dirty = !git(&[
        "status",
        "--porcelain",
        "--",
        "crates",
        "Cargo.toml",
        "Cargo.lock",
    ])
    .unwrap_or_default()
    .is_empty();
    (commit, agent_dirty)
}

/// `git ARGS…` in the project root: its trimmed output, or why it failed.
fn git(args: &[&str]) -> anyhow::Result<String> {
    let out = run_command(
        std::process::Command::new("git")
            .args(args)
            .current_dir(crate::project_root()),
    )?;
    Ok(out.trim().to_owned())
}

/// The testbed and what the parts share.
pub(crate) struct Env {
    pub(crate) testbed: Testbed,
    pub(crate) progress: Progress,
    /// The bench's own dir in the plane's work dir (checkpoint dirs, agent logs, sockets).
    pub(crate) dir: PathBuf,
    /// Makes namespaces unique, so a reused plane can run the bench again.
    run_id: String,
    /// Added to namespace and dir names when the same parts run again (the baseline).
    pub(crate) variant: String,
    runtime: tokio::runtime::Runtime,
}

/// The name of the Secret (`parent-certs`) and ConfigMap (`parent-config`) every parent
/// with data mounts.
const PARENT_DATA: &str = "parent";

impl Env {
    fn new(testbed: Testbed, progress: Progress) -> anyhow::Result<Env> {
        let plane = &testbed.plane;
        anyhow::ensure!(
            plane.audit_log().is_file(),
            "{} has no audit log: it was started before audit logging was added; start a new one",
            plane.workdir().display()
        );
        let run_id = random_hex(2)?;
        let dir = plane.workdir().join(format!("bench-{run_id}"));
        fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        Ok(Env {
            testbed,
            progress,
            dir,
            run_id,
            variant: String::new(),
            runtime,
        })
    }

    /// A fresh namespace for `part`, where the agent's user has its deployed rights, with the
    /// Secret and ConfigMap parents mount.
    pub(crate) fn namespace(&self, part: &str) -> anyhow::Result<String> {
        let ns = format!("bench-{part}-{}{}", self.run_id, self.variant);
        self.testbed.create_namespace(&ns, AGENT_ROLE)?;
        self.testbed.create_parent_data(&ns, PARENT_DATA)?;
        Ok(ns)
    }

    /// An annotated parent mounting the namespace's Secret and ConfigMap.
    pub(crate) fn parent(&self, ns: &str, name: &str) -> PodBuilder {
        parent_with_data(ns, name, PARENT_DATA)
    }

    /// Checkpoint dirs of their own for one agent.
    pub(crate) fn dirs(&self, name: &str) -> anyhow::Result<AgentDirs> {
        self.testbed
            .agent_dirs(&self.dir.join(format!("{name}{}", self.variant)))
    }

    /// Starts the release agent at its production log level, its log in the bench dir; waits
    /// until it is ready (holds the lock, completed a pass).
    pub(crate) fn start_agent(&self, config: &AgentConfig) -> anyhow::Result<Agent> {
        let mut agent =
            Agent::start_with_log_filter(&self.testbed.agent_bin, config, &self.dir, AGENT_LOG_LEVEL)?;
        agent.wait_ready()?;
        Ok(agent)
    }

    /// Stops the agent, removes its checkpoints (static pods included: the static pod dir is
    /// shared) and deletes the pods of `ns`, so the next part starts on a quiet node.
    pub(crate) fn clean_up(
        &self,
        agent: Option<&mut Agent>,
        dirs: &[AgentDirs],
        ns: &str,
    ) -> anyhow::Result<()> {
        if let Some(agent) = agent {
            agent.stop()?;
        }
        for d in dirs {
            self.testbed.drain(d)?;
        }
        self.testbed
            .kubectl
            .run(
                &[
                    "delete",
                    "pods",
                    "--all",
                    "-n",
                    ns,
                    "--grace-period=0",
                    "--force",
                    "--wait=false",
                ],
                None,
            )
            .map(drop)
    }

    /// A client as admin, for the timed API requests: in-process, so the latency measured
    /// does not include starting kubectl. A fresh one per part (its connections do not
    /// survive an API server restart).
    pub(crate) fn api_client(&self) -> anyhow::Result<kube::Client> {
        self.runtime
            .block_on(admin_client(&self.testbed.plane.kubeconfig()))
    }

    pub(crate) fn create_pod(&self, client: &kube::Client, pod: &Value) -> anyhow::Result<()> {
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default");
        let typed: Pod = serde_json::from_value(pod.clone()).context("not a Pod")?;
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        self.runtime
            .block_on(api.create(&PostParams::default(), &typed))
            .with_context(|| format!("cannot create pod {ns}/{}", pod["metadata"]["name"]))?;
        Ok(())
    }

    /// Deletes with grace period 0, as the kubelet's final delete does.
    pub(crate) fn delete_pod_now(&self, client: &kube::Client, ns: &str, name: &str) -> anyhow::Result<()> {
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        self.runtime
            .block_on(api.delete(name, &params))
            .with_context(|| format!("cannot delete pod {ns}/{name}"))?;
        Ok(())
    }
}

/// Where the checkpoint of `ns/name` lives in `dirs` (`ckpt-store`'s layout).
pub(crate) struct CheckpointPaths {
    pub(crate) inactive: PathBuf,
    pub(crate) active: PathBuf,
    pub(crate) secrets: PathBuf,
    pub(crate) config_maps: PathBuf,
}

impl CheckpointPaths {
    pub(crate) fn of(dirs: &AgentDirs, ns: &str, name: &str) -> CheckpointPaths {
        let file = format!("{ns}_{name}.json");
        CheckpointPaths {
            inactive: dirs.checkpoint_dir.join("inactive-manifests").join(&file),
            active: dirs.manifests_dir.join(&file),
            secrets: dirs.checkpoint_dir.join("checkpoint-secrets").join(ns).join(name),
            config_maps: dirs
                .checkpoint_dir
                .join("checkpoint-configmaps")
                .join(ns)
                .join(name),
        }
    }

    /// Nothing of the checkpoint is left on disk.
    pub(crate) fn gone(&self) -> bool {
        [&self.inactive, &self.active, &self.secrets, &self.config_maps]
            .iter()
            .all(|p| !p.exists())
    }
}

/// Files in `dir` whose name starts with `prefix`.
pub(crate) fn count_files(dir: &Path, prefix: &str) -> usize {
    fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
            .count()
    })
}

/// A client from the plane's admin kubeconfig.
async fn admin_client(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    let file = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("cannot read {}", kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
        .await
        .with_context(|| format!("kubeconfig {}", kubeconfig.display()))?;
    kube::Client::try_from(config).context("cannot create the API client")
}
