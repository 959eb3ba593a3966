//! Programs from crates.io that a task runs (the release's SBOM generator): each installed
//! once with `cargo install --locked` at the version the task was written for, into the
//! environment's cache ([`cache_root`]), outside the repository and `~/.cargo/bin`.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::Context;

use crate::command::run_on_terminal;
use crate::e2e_env::cache_root;
use crate::image::nested_cargo;
use crate::progress::{Progress, human_duration};

/// A crate's program, pinned.
#[derive(Clone, Copy, Debug)]
pub struct CargoTool {
    pub krate: &'static str,
    pub version: &'static str,
    /// The program's file name in the crate's `bin/`.
    pub program: &'static str,
}

impl CargoTool {
    /// Where it is installed: a root of its own per version, so two versions never mix.
    pub fn path(&self) -> PathBuf {
        cache_root()
            .join("cargo-tools")
            .join(format!("{}-{}", self.krate, self.version))
            .join("bin")
            .join(self.program)
    }

    /// The program's path, after `cargo install --locked` when it is not installed yet.
    pub fn ensure_installed(&self, progress: Progress) -> anyhow::Result<PathBuf> {
        let path = self.path();
        if path.is_file() {
            return Ok(path);
        }
        let root = path
            .parent()
            .and_then(|bin| bin.parent())
            .context("a tool's path has a root")?;
        progress.say(&format!(
            "cargo install {} {} --locked (once, into {}; minutes on 2 cores)",
            self.krate,
            self.version,
            root.display()
        ));
        let started = Instant::now();
        let mut cargo = nested_cargo();
        cargo
            .args(["install", "--locked", "--version", self.version, self.krate])
            .arg("--root")
            .arg(root)
            // Its own temporary target dir, which cargo removes: the workspace's target dir
            // would keep a second dependency tree for good.
            .env_remove("CARGO_TARGET_DIR");
        run_on_terminal(&mut cargo).with_context(|| format!("installing {} failed", self.krate))?;
        anyhow::ensure!(path.is_file(), "cargo install left no {}", path.display());
        progress.say(&format!(
            "{} {} installed in {}",
            self.krate,
            self.version,
            human_duration(started.elapsed())
        ));
        Ok(path)
    }

    /// A command running the installed program.
    pub fn command(&self, progress: Progress) -> anyhow::Result<Command> {
        Ok(Command::new(self.ensure_installed(progress)?))
    }
}
