//! Debian packages the tasks need (the control plane's build, the images, the runtime that
//! imports them), installed with apt-get when dpkg does not list them.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::Context;

use crate::process::run_logged;
use crate::progress::Progress;
use crate::progress::human_duration;

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
        run_logged(
            label,
            &mut Apt::command(args),
            &self.log,
            self.progress,
            &String::new,
        )?;
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
