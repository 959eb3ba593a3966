//! `pod-checkpointer` as real processes: `run` with a debug log file in the work dir, its
//! health and metrics endpoints, and the `inspect -o json` and `drain` subcommands on the
//! same directories.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;

use crate::command::run_command;
use crate::process::{log_tail, send_signal};
use crate::wait::{DEFAULT_TIMEOUT, Probe, wait_for};

/// The agent's log filter: its own debug lines, without the HTTP/2 and TLS chatter.
pub const AGENT_LOG_FILTER: &str = "debug,h2=info,hyper=info,hyper_util=info,tower=info,rustls=info";

/// How long a SIGTERMed agent gets to exit before SIGKILL (it exits within a pass).
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Where one agent keeps its checkpoints, and its lock: what `run`, `inspect` and `drain`
/// are given.
#[derive(Clone, Debug)]
pub struct AgentDirs {
    pub checkpoint_dir: PathBuf,
    /// The kubelet's static pod dir (active checkpoints).
    pub manifests_dir: PathBuf,
    pub lock_file: PathBuf,
}

impl AgentDirs {
    /// `root/checkpoints` and `root/pod-checkpointer.lock`, with active checkpoints in
    /// `manifests_dir`; creates `root`.
    pub fn under(root: &Path, manifests_dir: &Path) -> anyhow::Result<AgentDirs> {
        fs::create_dir_all(root).with_context(|| format!("cannot create {}", root.display()))?;
        Ok(AgentDirs {
            checkpoint_dir: root.join("checkpoints"),
            manifests_dir: manifests_dir.to_owned(),
            lock_file: root.join("pod-checkpointer.lock"),
        })
    }

    fn args(&self) -> Vec<String> {
        vec![
            format!("--checkpoint-dir={}", self.checkpoint_dir.display()),
            format!("--manifests-dir={}", self.manifests_dir.display()),
            format!("--lock-file={}", self.lock_file.display()),
        ]
    }
}

/// The flags of one `pod-checkpointer run`.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// Names the process in messages and its log file (`agent-<label>.log`).
    pub label: String,
    pub node_name: String,
    /// The DaemonSet pod's name, or for the static copy `<name>-<node>`.
    pub pod_name: String,
    pub pod_namespace: String,
    /// `None`: no `--kubeconfig` and no service environment, like the static copy after a
    /// reboot (the agent then falls back to the credentials the connected copy kept).
    pub kubeconfig: Option<PathBuf>,
    pub kubelet_url: String,
    pub runtime_endpoint: String,
    pub dirs: AgentDirs,
    pub namespaces: Vec<String>,
    pub gc_strategy: Option<String>,
    pub grace_period: Option<String>,
    /// More `run` flags, as `--flag=value`.
    pub extra_args: Vec<String>,
}

/// A running (or exited) `pod-checkpointer run`; dropping it SIGKILLs it if it still runs.
pub struct Agent {
    label: String,
    child: Child,
    exit: Option<ExitStatus>,
    log: PathBuf,
    metrics_addr: String,
}

impl Agent {
    /// Starts `bin run …` with `RUST_LOG` set to [`AGENT_LOG_FILTER`] and its output in
    /// `log_dir/agent-<label>.log`, health endpoints on a free loopback port.
    pub fn start(bin: &Path, config: &AgentConfig, log_dir: &Path) -> anyhow::Result<Agent> {
        Agent::start_with_log_filter(bin, config, log_dir, AGENT_LOG_FILTER)
    }

    /// [`start`](Agent::start) with another `RUST_LOG`: the benchmarks measure the agent at
    /// its production log level, since debug logging costs CPU.
    pub fn start_with_log_filter(
        bin: &Path,
        config: &AgentConfig,
        log_dir: &Path,
        log_filter: &str,
    ) -> anyhow::Result<Agent> {
        let metrics_addr = format!("127.0.0.1:{}", free_port()?);
        let log = log_dir.join(format!("agent-{}.log", config.label.replace('/', "-")));
        let out = File::options()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("cannot open {}", log.display()))?;
        let mut command = Command::new(bin);
        command
            .arg("run")
            .arg(format!("--node-name={}", config.node_name))
            .arg(format!("--pod-name={}", config.pod_name))
            .arg(format!("--pod-namespace={}", config.pod_namespace))
            .arg(format!("--kubelet-url={}", config.kubelet_url))
            .arg(format!("--runtime-endpoint={}", config.runtime_endpoint))
            .arg(format!("--namespaces={}", config.namespaces.join(",")))
            .arg(format!("--metrics-addr={metrics_addr}"))
            .args(config.dirs.args());
        if let Some(strategy) = &config.gc_strategy {
            command.arg(format!("--gc-strategy={strategy}"));
        }
        if let Some(grace) = &config.grace_period {
            command.arg(format!("--checkpoint-grace-period={grace}"));
        }
        if let Some(kubeconfig) = &config.kubeconfig {
            command.arg(format!("--kubeconfig={}", kubeconfig.display()));
        }
        command.args(&config.extra_args);
        let child = command
            .env("RUST_LOG", log_filter)
            .env_remove("KUBECONFIG")
            // Never in-cluster by accident: the suite runs the agent as a process.
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBERNETES_SERVICE_PORT")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        Ok(Agent {
            label: config.label.clone(),
            child,
            exit: None,
            log,
            metrics_addr,
        })
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The whole log (for ordering checks and error lines).
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }

    /// The exit status once it has exited.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().ok().flatten();
        }
        self.exit
    }

    /// Fails, with the end of the log, when the process has exited.
    pub fn ensure_running(&mut self) -> anyhow::Result<()> {
        match self.exit_status() {
            None => Ok(()),
            Some(status) => bail!(
                "agent {} exited unexpectedly ({status}); last lines of {}:\n{}",
                self.label,
                self.log.display(),
                self.log_tail(30)
            ),
        }
    }

    /// `GET path` on the agent's health server: status code and body.
    pub fn http_get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        http_get(&self.metrics_addr, path)
    }

    /// Waits for `/readyz` to answer 200 `ok`: it holds the lock and completed a pass (a
    /// copy waiting on the lock is Ready too, but says `standby`).
    pub fn wait_ready(&mut self) -> anyhow::Result<Duration> {
        let label = self.label.clone();
        wait_for(&format!("agent {label} /readyz 200 ok"), DEFAULT_TIMEOUT, || {
            self.ensure_running()?;
            Ok(match self.http_get("/readyz") {
                Ok((200, body)) if body.trim() == "ok" => Probe::Ready(()),
                Ok((code, body)) => Probe::Waiting(format!("{code} {}", body.trim())),
                Err(e) => Probe::Waiting(format!("{e:#}")),
            })
        })
        .map(|((), took)| took)
    }

    /// Waits for `/readyz` to say `standby`: it waits for the lock.
    pub fn wait_standby(&mut self) -> anyhow::Result<Duration> {
        let label = self.label.clone();
        wait_for(&format!("agent {label} on standby"), DEFAULT_TIMEOUT, || {
            self.ensure_running()?;
            Ok(match self.http_get("/readyz") {
                Ok((_, body)) if body.trim() == "standby" => Probe::Ready(()),
                Ok((code, body)) => Probe::Waiting(format!("{code} {}", body.trim())),
                Err(e) => Probe::Waiting(format!("{e:#}")),
            })
        })
        .map(|((), took)| took)
    }

    /// The value of one sample in `/metrics`, e.g. `pod_checkpointer_api_state{state="synced"}`.
    pub fn metric(&self, sample: &str) -> anyhow::Result<Option<f64>> {
        let (code, body) = self.http_get("/metrics")?;
        anyhow::ensure!(code == 200, "/metrics answered {code}");
        Ok(metric_value(&body, sample))
    }

    /// Waits until the agent's API view is `state` (`unreachable`, `reachable`, `synced`).
    pub fn wait_api_state(&mut self, state: &str) -> anyhow::Result<Duration> {
        let sample = format!("pod_checkpointer_api_state{{state=\"{state}\"}}");
        let label = self.label.clone();
        wait_for(
            &format!("agent {label} to see the API server as {state}"),
            DEFAULT_TIMEOUT,
            || {
                self.ensure_running()?;
                Ok(match self.metric(&sample) {
                    Ok(Some(1.0)) => Probe::Ready(()),
                    Ok(_) => Probe::Waiting(format!("{sample} is not 1")),
                    Err(e) => Probe::Waiting(format!("{e:#}")),
                })
            },
        )
        .map(|((), took)| took)
    }

    /// Waits for the process to exit by itself.
    pub fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let label = self.label.clone();
        wait_for(&format!("agent {label} to exit"), timeout, || {
            Ok(match self.exit_status() {
                Some(status) => Probe::Ready(status),
                None => Probe::Waiting("still running".into()),
            })
        })
        .map(|(status, _)| status)
    }

    /// SIGTERM, then SIGKILL after a grace period; returns how it exited.
    pub fn stop(&mut self) -> anyhow::Result<ExitStatus> {
        if let Some(status) = self.exit_status() {
            return Ok(status);
        }
        send_signal(self.pid(), "TERM")?;
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if let Some(status) = self.exit_status() {
                return Ok(status);
            }
            sleep(Duration::from_millis(20));
        }
        self.kill()?;
        bail!(
            "agent {} ignored SIGTERM for {} s and was killed",
            self.label,
            STOP_GRACE.as_secs()
        )
    }

    /// SIGKILL, like a crash or a power cut: no clean-up, the lock is released by the kernel.
    pub fn kill(&mut self) -> anyhow::Result<()> {
        if self.exit_status().is_none() {
            self.child.kill().context("cannot kill the agent")?;
            self.exit = Some(self.child.wait()?);
        }
        Ok(())
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// `pod-checkpointer inspect -o json` on `dirs`.
pub fn inspect(bin: &Path, dirs: &AgentDirs) -> anyhow::Result<Inspect> {
    let output = run_command(
        Command::new(bin)
            .args(["inspect", "-o", "json"])
            .args(dirs.args()),
    )?;
    let report: Value = serde_json::from_str(&output).context("pod-checkpointer inspect printed no JSON")?;
    Inspect::from_json(&report)
}

/// `pod-checkpointer drain --force` on `dirs`; returns what it printed.
pub fn drain(bin: &Path, dirs: &AgentDirs) -> anyhow::Result<String> {
    run_command(Command::new(bin).args(["drain", "--force"]).args(dirs.args()))
}

/// What `inspect -o json` reports.
#[derive(Clone, Debug, Default)]
pub struct Inspect {
    pub checkpoints: Vec<CheckpointInfo>,
    pub lock_holder: Option<String>,
}

/// One checkpoint of an [`Inspect`] report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointInfo {
    /// `namespace/name` of the parent.
    pub pod: String,
    /// `inactive`, `active` or `active-only`.
    pub state: String,
    pub inactive_manifest: Option<PathBuf>,
    pub active_manifest: Option<PathBuf>,
    /// Secret and ConfigMap files.
    pub data_files: u64,
    pub parent_uid: Option<String>,
    pub owner: Option<String>,
    /// Set while a GC deadline runs (the parent is absent from a synced API view).
    pub parent_absent_since: Option<String>,
    /// The content on disk is the one its parent proved (Ready for a minute with it).
    pub known_good: bool,
    /// Set when the agent set this revision aside (it crash-looped while active).
    pub known_good_suspended_since: Option<String>,
    /// One of several revisions of a DaemonSet's pod: whether it is the newest.
    pub newest_revision: Option<bool>,
    /// One of several revisions: whether losing the API would run this one.
    pub runs_if_api_lost: Option<bool>,
}

impl Inspect {
    fn from_json(report: &Value) -> anyhow::Result<Inspect> {
        let text = |v: &Value| v.as_str().map(str::to_owned);
        let checkpoints = report["checkpoints"]
            .as_array()
            .context("inspect: no `checkpoints` array")?
            .iter()
            .map(|c| {
                Ok(CheckpointInfo {
                    pod: text(&c["pod"]).context("inspect: a checkpoint without `pod`")?,
                    state: text(&c["state"]).unwrap_or_default(),
                    inactive_manifest: text(&c["inactive_manifest"]).map(PathBuf::from),
                    active_manifest: text(&c["active_manifest"]).map(PathBuf::from),
                    data_files: c["data_files"].as_u64().unwrap_or(0),
                    parent_uid: text(&c["parent_uid"]),
                    owner: text(&c["owner"]),
                    parent_absent_since: text(&c["parent_absent_since"]),
                    known_good: c["known_good"].as_bool().unwrap_or(false),
                    known_good_suspended_since: text(&c["known_good_suspended_since"]),
                    newest_revision: c["revision"]["newest"].as_bool(),
                    runs_if_api_lost: c["revision"]["runs_if_api_lost"].as_bool(),
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Inspect {
            checkpoints,
            lock_holder: text(&report["lock_holder"]),
        })
    }

    /// The checkpoint of `pod` (`namespace/name`).
    pub fn get(&self, pod: &str) -> Option<&CheckpointInfo> {
        self.checkpoints.iter().find(|c| c.pod == pod)
    }

    /// One line for "last seen" messages: `ns/a inactive (2 files), ns/b active`.
    pub fn summary(&self) -> String {
        if self.checkpoints.is_empty() {
            return "no checkpoints".into();
        }
        let items: Vec<String> = self
            .checkpoints
            .iter()
            .map(|c| {
                let files = if c.data_files > 0 {
                    format!(" ({} files)", c.data_files)
                } else {
                    String::new()
                };
                let gc = if c.parent_absent_since.is_some() {
                    " [parent absent]"
                } else {
                    ""
                };
                format!("{} {}{files}{gc}", c.pod, c.state)
            })
            .collect();
        items.join(", ")
    }
}

/// A loopback port nothing listens on right now.
fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot find a free port")?;
    Ok(listener.local_addr()?.port())
}

/// A minimal HTTP/1.1 GET (the agent answers with `Connection: close`).
fn http_get(addr: &str, path: &str) -> anyhow::Result<(u16, String)> {
    let timeout = Duration::from_secs(2);
    let socket = addr.parse().with_context(|| format!("bad address {addr}"))?;
    let mut stream =
        TcpStream::connect_timeout(&socket, timeout).with_context(|| format!("cannot connect to {addr}"))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .with_context(|| format!("no answer from {addr}{path}"))?;
    parse_http_response(&response).with_context(|| format!("bad answer from {addr}{path}"))
}

fn parse_http_response(response: &str) -> anyhow::Result<(u16, String)> {
    let (head, body) = response.split_once("\r\n\r\n").context("no header end")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .context("no status code")?;
    Ok((status, body.to_owned()))
}

/// The value of `sample` (name with labels, exactly as exposed) in a Prometheus text page.
fn metric_value(page: &str, sample: &str) -> Option<f64> {
    page.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| line.strip_prefix(sample)?.strip_prefix(' ')?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn http_responses_split_into_status_and_body() {
        let (code, body) =
            parse_http_response("HTTP/1.1 503 Service Unavailable\r\nContent-Length: 7\r\n\r\nstandby")
                .unwrap();
        assert_eq!(code, 503);
        assert_eq!(body, "standby");
        assert!(parse_http_response("garbage").is_err());
    }

    #[test]
    fn metric_samples_are_found_by_name_and_labels() {
        let page = "# HELP x\npod_checkpointer_api_state{state=\"unreachable\"} 0\n\
                    pod_checkpointer_api_state{state=\"synced\"} 1\npod_checkpointer_lock_held 1\n";
        assert_eq!(
            metric_value(page, "pod_checkpointer_api_state{state=\"synced\"}"),
            Some(1.0)
        );
        assert_eq!(metric_value(page, "pod_checkpointer_lock_held"), Some(1.0));
        assert_eq!(metric_value(page, "pod_checkpointer_lock"), None);
    }

    #[test]
    fn inspect_reports_parse_and_summarize() {
        let report = json!({
            "lock_holder": "pid 1",
            "checkpoints": [
                {"pod": "ns/a", "state": "inactive", "data_files": 2, "inactive_manifest": "/c/a.json",
                 "active_manifest": null, "parent_absent_since": null},
                {"pod": "ns/b", "state": "active", "data_files": 0, "inactive_manifest": "/c/b.json",
                 "active_manifest": "/m/b.json", "parent_absent_since": "2026-01-01T00:00:00Z"},
            ],
            "runs_after_reboot": ["ns/b"],
        });
        let inspect = Inspect::from_json(&report).unwrap();
        assert_eq!(inspect.get("ns/a").unwrap().data_files, 2);
        assert_eq!(
            inspect.get("ns/b").unwrap().active_manifest.as_deref(),
            Some(Path::new("/m/b.json"))
        );
        assert_eq!(
            inspect.summary(),
            "ns/a inactive (2 files), ns/b active [parent absent]"
        );
        assert!(Inspect::from_json(&json!({})).is_err());
    }
}
