//! Debian packages the tasks need (the control plane's build, the images, the runtime that
//! imports them), installed with apt-get when dpkg does not list them.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::e2e_env::human_duration;
use crate::e2e_env::process::{last_log_line, log_tail_section};
use crate::progress::Progress;

/// How often a long apt-get reports that it is still running.
const HEARTBEAT: Duration = Duration::from_secs(15);

/// apt-get, updating the package lists at most once; its output goes to a log file.
pub struct Apt {
    log: PathBuf,
    progress: Progress,
    updated: bool,
}

impl Apt {
    /// apt-get's output is appended to `log`; each step prints a progress line.
    pub fn new(log: PathBuf, progress: Progress) -> Apt {
        Apt {
            log,
            progress,
            updated: false,
        }
    }

    /// `apt-get ARGS…`, non-interactive.
    pub fn command(args: &[&str]) -> Command {
        let mut command = Command::new("apt-get");
        command
            .env("DEBIAN_FRONTEND", "noninteractive")
            // Wait for another apt instead of failing at once.
            .args(["-o", "DPkg::Lock::Timeout=300"])
            .args(args);
        command
    }

    pub fn update(&mut self) -> anyhow::Result<()> {
        if !self.updated {
            self.run("apt-get update", &["update"])?;
            self.updated = true;
        }
        Ok(())
    }

    /// Installs those of `packages` that are not installed yet.
    pub fn install(&mut self, packages: &[&str]) -> anyhow::Result<()> {
        let missing = missing_packages(packages)?;
        if missing.is_empty() {
            return Ok(());
        }
        self.update()?;
        let label = format!("apt-get install {}", missing.join(" "));
        let mut args = vec!["install", "-y", "--no-install-recommends"];
        args.extend(missing.iter().map(String::as_str));
        self.run(&label, &args)
    }

    fn run(&self, label: &str, args: &[&str]) -> anyhow::Result<()> {
        self.progress.say(&format!("{label} …"));
        let started = Instant::now();
        run_logged(label, &mut Apt::command(args), &self.log, self.progress)?;
        self.progress
            .say(&format!("{label}: done in {}", human_duration(started.elapsed())));
        Ok(())
    }
}

/// The packages among `packages` that dpkg does not list as installed.
pub fn missing_packages(packages: &[&str]) -> anyhow::Result<Vec<String>> {
    // Exits non-zero when a package is unknown; stdout still lists the known ones.
    let output = Command::new("dpkg-query")
        .args(["-W", "-f=${Package} ${db:Status-Abbrev}\n"])
        .args(packages)
        .stderr(Stdio::null())
        .output()
        .context("cannot run dpkg-query")?;
    let listed = String::from_utf8_lossy(&output.stdout);
    Ok(packages
        .iter()
        .filter(|pkg| {
            !listed.lines().any(|line| {
                let mut fields = line.split_whitespace();
                fields.next() == Some(**pkg) && fields.next() == Some("ii")
            })
        })
        .map(|pkg| (*pkg).to_owned())
        .collect())
}

/// Runs `command` with its output appended to `log`; on failure the error carries the log's tail.
fn run_logged(label: &str, command: &mut Command, log: &Path, progress: Progress) -> anyhow::Result<()> {
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
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
    let mut next_heartbeat = HEARTBEAT;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if started.elapsed() >= next_heartbeat {
            next_heartbeat += HEARTBEAT;
            progress.say(&format!(
                "  {label}: {} elapsed — {}",
                human_duration(started.elapsed()),
                last_log_line(log)
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
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
