//! The e2e environment's child processes: spawned with their output in a log file, signalled
//! with `kill(1)` (unsafe code is forbidden, so no libc), and watched through `/proc`.
//!
//! A process is either *owned* (spawned here; its [`Child`] handle reaps it) or *attached*
//! (known only by a pid file, e.g. in `cargo xtask e2e-env stop`). An attached pid is only
//! taken for ours when its environment carries [`OWNER_ENV`] with our work dir, so a reused
//! pid never gets killed. PID 1 on these machines may not reap orphans: a zombie counts as
//! exited.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::progress::{Progress, human_duration};

/// Environment variable set on every process the environment starts, valued with its work dir.
pub const OWNER_ENV: &str = "POD_CHECKPOINTER_E2E_WORKDIR";

/// One long-running process of the environment (etcd, kube-apiserver, the hollow node).
pub struct Managed {
    name: &'static str,
    pid: u32,
    /// Set for processes spawned by this process, so that they are reaped.
    child: Option<Child>,
    log: PathBuf,
    exited: bool,
}

impl Managed {
    /// Spawns `command` with stdin closed and stdout and stderr appended to `log`.
    pub fn spawn(
        name: &'static str,
        command: &mut Command,
        log: &Path,
        owner: &Path,
    ) -> anyhow::Result<Managed> {
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("cannot open {}", log.display()))?;
        let err = out.try_clone()?;
        let child = command
            .env(OWNER_ENV, owner)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("cannot start {name} ({:?})", command.get_program()))?;
        Ok(Managed {
            name,
            pid: child.id(),
            child: Some(child),
            log: log.to_owned(),
            exited: false,
        })
    }

    /// A process started by another invocation, known from its pid. A pid that no longer
    /// carries our [`OWNER_ENV`] (the process exited and the pid was reused) counts as exited.
    pub fn attach(name: &'static str, pid: u32, log: &Path, owner: &Path) -> Managed {
        let ours = environ_has(pid, OWNER_ENV, &owner.to_string_lossy());
        Managed {
            name,
            pid,
            child: None,
            log: log.to_owned(),
            exited: !ours,
        }
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The pid while the process may still run; `None` once it is known to have exited (its
    /// pid may then be another process's).
    pub fn live_pid(&self) -> Option<u32> {
        (!self.exited && is_alive(self.pid)).then_some(self.pid)
    }

    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Whether the process still runs (a stopped process runs; a zombie does not).
    pub fn is_running(&mut self) -> bool {
        if self.exited {
            return false;
        }
        let running = match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            // Not the environ check again: an exiting process loses its environ before it
            // closes its sockets and becomes a zombie.
            None => is_alive(self.pid),
        };
        self.exited = !running;
        running
    }

    /// Sends `signal` (a name such as `KILL`, `STOP`) unless the process has exited.
    pub fn signal(&mut self, signal: &str) -> anyhow::Result<()> {
        if !self.is_running() {
            return Ok(());
        }
        send_signal(self.pid, signal)
    }

    /// Waits until the process has exited; false when it still runs after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.is_running() {
            if Instant::now() >= deadline {
                return false;
            }
            sleep(Duration::from_millis(20));
        }
        true
    }

    /// Sends `signal`, waits up to `grace`, then SIGKILLs; returns once the process is gone.
    pub fn terminate(&mut self, signal: &str, grace: Duration) -> anyhow::Result<()> {
        self.signal(signal)?;
        if signal != "KILL" {
            // A SIGSTOPped process would keep a SIGTERM pending forever.
            self.signal("CONT")?;
        }
        if self.wait_exit(grace) {
            return Ok(());
        }
        self.signal("KILL")?;
        if self.wait_exit(Duration::from_secs(10)) {
            return Ok(());
        }
        bail!("{} (pid {}) did not exit after SIGKILL", self.name, self.pid)
    }

    /// Fails with the tail of the log when the process has exited.
    pub fn ensure_running(&mut self, what: &str) -> anyhow::Result<()> {
        if self.is_running() {
            return Ok(());
        }
        let status = match &mut self.child {
            Some(child) => child.try_wait().ok().flatten().map(|s| s.to_string()),
            None => None,
        };
        bail!(
            "{what}: {} exited{}\n{}",
            self.name,
            status.map(|s| format!(" ({s})")).unwrap_or_default(),
            log_tail_section(&self.log, 30)
        )
    }
}

/// Runs `kill -s SIGNAL PID`.
pub fn send_signal(pid: u32, signal: &str) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .args(["-s", signal, &pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .context("cannot run kill")?;
    // A process that exited between the check and the signal is fine.
    if !status.success() && is_alive(pid) {
        bail!("kill -s {signal} {pid} failed: {status}");
    }
    Ok(())
}

/// Runs `kill -s SIGNAL PID…` once for many pids. Its exit status is ignored: it fails as a
/// whole when one pid has exited meanwhile, and still signals the others.
pub fn send_signals(pids: &[u32], signal: &str) -> anyhow::Result<()> {
    if pids.is_empty() {
        return Ok(());
    }
    Command::new("kill")
        .args(["-s", signal])
        .args(pids.iter().map(u32::to_string))
        .stderr(Stdio::null())
        .status()
        .context("cannot run kill")?;
    Ok(())
}

/// Whether `pid` exists and is not a zombie (nor dead). The leader of a multi-threaded
/// process (Go's) turns zombie while its other threads are still exiting and holding its
/// sockets, so a zombie with threads left still counts as alive.
pub fn is_alive(pid: u32) -> bool {
    match proc_state(pid) {
        None => false,
        Some('Z' | 'X' | 'x') => thread_count(pid) > 1,
        Some(_) => true,
    }
}

fn thread_count(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| tasks.count())
        .unwrap_or(0)
}

/// The one-letter state of `pid` from `/proc/PID/stat`, `None` when there is no such process.
pub fn proc_state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_state(&stat)
}

/// The state field of a `/proc/PID/stat` line.
pub fn parse_stat_state(stat: &str) -> Option<char> {
    stat_fields(stat)?.first()?.chars().next()
}

/// The fields of a `/proc/PID/stat` line from the state (field 3) on. The command name in
/// parentheses before them may itself contain spaces and parentheses, so they start after
/// the *last* `)`.
pub fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().collect())
}

/// The live processes whose environment marks them as started for `owner` (see
/// [`OWNER_ENV`]), children that inherited it included.
pub fn owned_processes(owner: &Path) -> Vec<u32> {
    let owner = owner.to_string_lossy();
    all_pids()
        .into_iter()
        .filter(|pid| environ_has(*pid, OWNER_ENV, &owner) && is_alive(*pid))
        .collect()
}

/// Whether `/proc/PID/environ` holds `KEY=VALUE`.
fn environ_has(pid: u32, key: &str, value: &str) -> bool {
    let Ok(environ) = fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    let wanted = format!("{key}={value}");
    environ.split(|b| *b == 0).any(|entry| entry == wanted.as_bytes())
}

/// The last `lines` lines of a (possibly large) log file, read from its end.
pub fn log_tail(path: &Path, lines: usize) -> String {
    const MAX_TAIL_BYTES: u64 = 64 * 1024;
    let Ok(mut file) = File::open(path) else {
        return String::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(MAX_TAIL_BYTES);
    let mut bytes = Vec::new();
    if file.seek(SeekFrom::Start(start)).is_err() || file.read_to_end(&mut bytes).is_err() {
        return String::new();
    }
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The last `count` error lines of a log file: klog's `E` lines (the Kubernetes
/// components') and `level=error` ones (containerd's).
pub fn log_error_lines(path: &Path, count: usize) -> Vec<String> {
    error_lines(
        &String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()),
        count,
    )
}

fn error_lines(text: &str, count: usize) -> Vec<String> {
    let errors: Vec<&str> = (text.lines())
        .filter(|line| {
            let klog = line
                .strip_prefix('E')
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()));
            klog || line.contains("level=error")
        })
        .collect();
    errors[errors.len().saturating_sub(count)..]
        .iter()
        .map(|line| (*line).to_owned())
        .collect()
}

/// `--- last lines of NAME ---` followed by the tail, for error messages (only the file name:
/// a failed start removes its work dir).
pub fn log_tail_section(path: &Path, lines: usize) -> String {
    let name = path.file_name().unwrap_or(path.as_os_str()).to_string_lossy();
    format!("--- last lines of {name} ---\n{}", log_tail(path, lines))
}

/// The last non-empty line of a log, shortened for a one-line heartbeat.
pub fn last_log_line(path: &Path) -> String {
    const MAX_CHARS: usize = 100;
    let tail = log_tail(path, 5);
    let line = tail
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    if line.chars().count() > MAX_CHARS {
        let short: String = line.chars().take(MAX_CHARS).collect();
        format!("{short}…")
    } else {
        line.to_owned()
    }
}

/// The resident set size of `pid` in KiB (`VmRSS` in `/proc/PID/status`).
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|line| {
        line.strip_prefix("VmRSS:")?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    })
}

/// The parent pid of `pid` (field 4 of `/proc/PID/stat`).
pub fn parent_pid(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_fields(&stat)?.get(1)?.parse().ok()
}

/// Every pid in `/proc`.
pub fn all_pids() -> Vec<u32> {
    fs::read_dir("/proc")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `program` is an executable file in one of the `PATH` directories.
pub fn in_path(program: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            fs::metadata(dir.join(program)).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

/// Whether a program given by path is there: an absolute path is a file, a bare name is
/// [`in_path`] (Debian's tools, named rather than built beside the others).
pub fn installed(program: &std::path::Path) -> bool {
    if program.is_absolute() {
        program.is_file()
    } else {
        in_path(&program.to_string_lossy())
    }
}

/// `bytes` random bytes from the kernel, hex-encoded (tokens, unique names).
pub fn random_hex(bytes: usize) -> anyhow::Result<String> {
    let mut buf = vec![0u8; bytes];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .context("cannot read /dev/urandom")?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// How often [`run_logged`] reports that a long command is still running.
const LOGGED_HEARTBEAT: Duration = Duration::from_secs(15);

/// Runs `command` with its output appended to `log`. Every 15 s it prints, through
/// `progress`, the elapsed time, the log's last line and `note()` (e.g. what is being
/// compiled). On failure the error holds the log's path and tail.
pub fn run_logged(
    label: &str,
    command: &mut Command,
    log: &Path,
    progress: Progress,
    note: &dyn Fn() -> String,
) -> anyhow::Result<()> {
    if let Some(dir) = log.parent() {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("cannot open {}", log.display()))?;
    writeln!(file, "\n$ {command:?}")?;
    let mut child = command
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .with_context(|| format!("cannot start {label}"))?;
    let started = Instant::now();
    let mut next_heartbeat = LOGGED_HEARTBEAT;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if started.elapsed() >= next_heartbeat {
            next_heartbeat += LOGGED_HEARTBEAT;
            progress.say(&format!(
                "  {label}: {} elapsed — {}{}",
                human_duration(started.elapsed()),
                last_log_line(log),
                note()
            ));
        }
        sleep(Duration::from_millis(200));
    };
    if !status.success() {
        bail!(
            "{label} failed ({status}); full log: {}\n{}",
            log.display(),
            log_tail_section(log, 40)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn error_lines_are_klogs_and_containerds_last_ones() {
        let log = "I1207 07:52:57.1 server.go:1] started\n\
                   E1207 07:52:58.2 kubelet.go:2] first\n\
                   time=\"2026-12-07\" level=error msg=\"second\"\n\
                   Everything is fine\n\
                   time=\"2026-12-07\" level=info msg=\"quiet\"\n\
                   E1207 07:52:59.3 kubelet.go:3] third\n";
        let check = |count: usize, expected: &[&str]| {
            let got = super::error_lines(log, count);
            let suffixes: Vec<&str> = got
                .iter()
                .map(|l| l.rsplit(' ').next().unwrap_or_default())
                .collect();
            assert_eq!(suffixes, expected, "{count}");
        };
        check(2, &["msg=\"second\"", "third"]);
        check(5, &["first", "msg=\"second\"", "third"]);
        check(0, &[]);
    }

    use super::*;

    #[test]
    fn stat_state_is_the_field_after_the_last_parenthesis() {
        assert_eq!(parse_stat_state("42 (etcd) S 1 42 42 0 -1"), Some('S'));
        assert_eq!(parse_stat_state("7 (kube-apiserver) Z 1 7 7 0"), Some('Z'));
        assert_eq!(parse_stat_state("9 (a) b (c)) T 1 9"), Some('T'));
        assert_eq!(parse_stat_state("garbage"), None);
        assert_eq!(parse_stat_state("1 (x)"), None);
    }

    #[test]
    fn own_process_is_alive_and_unknown_pid_is_not() {
        assert!(is_alive(std::process::id()));
        assert_eq!(proc_state(u32::MAX), None);
        assert!(!is_alive(u32::MAX));
    }

    #[test]
    fn own_process_has_a_parent_and_a_resident_size() {
        let me = std::process::id();
        assert_eq!(parent_pid(me), Some(std::os::unix::process::parent_id()));
        assert!(rss_kib(me).is_some_and(|kib| kib > 0));
        assert!(all_pids().contains(&me));
        assert_eq!(rss_kib(u32::MAX), None);
    }

    #[test]
    fn random_hex_has_two_digits_per_byte() {
        let hex = random_hex(16).unwrap();
        assert_eq!(hex.len(), 32);
        assert!(hex.chars().all(|c| c.is_ascii_hexdigit()));
    }
}
