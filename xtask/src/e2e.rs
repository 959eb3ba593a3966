//! `cargo xtask e2e [FILTER…]`: the end-to-end suite (`crates/ckpt-e2e/tests/e2e`) against a real
//! control plane. Builds what it needs (the cached Kubernetes binaries, the agent, the suite)
//! and runs the suite's binary itself rather than through `cargo test`, so that on Ctrl-C it
//! waits for the suite to stop its control plane before returning.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::Context;
use ckpt_e2e::command::{run_command, run_on_terminal};
use ckpt_e2e::e2e_env::{self, RELEASE_ENV, Release};
use ckpt_e2e::harness::agent_binary;
use ckpt_e2e::interrupt;
use ckpt_e2e::progress::{Progress, human_duration};

/// Run the end-to-end suite against a real kube-apiserver, etcd and hollow kubelet.
#[derive(clap::Args)]
pub(crate) struct E2e {
    /// Run only the scenarios whose name contains one of these.
    filters: Vec<String>,
    /// List the scenarios and exit.
    #[arg(long)]
    list: bool,
    /// The longer mode: also the scenarios kept out of CI for time (see `--list`)
    #[arg(long)]
    long: bool,
    /// The Kubernetes release to run on: `1.37` or `1.34`, built from its Go modules with
    /// containerd 2 and runc 1.5, or `1.20`, built from Debian's source with Debian's runtime
    #[arg(long, value_enum, default_value = "1.37")]
    kubernetes: Release,
}

impl E2e {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        if self.list {
            let suite = build_suite(false)?;
            return run_binary(
                &suite,
                &["--list".to_owned()],
                Mode::of(self.long),
                self.kubernetes,
                std::path::Path::new(""),
            );
        }
        run_suite_on(&self.filters, false, Mode::of(self.long), self.kubernetes)
    }
}

/// What the suite runs its scenarios for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// What CI runs.
    Ci,
    /// The longer mode: the scenarios and series kept out of CI for time.
    Long,
    /// `cargo xtask demo --self-hosted`: one power cut, narrated.
    Demo,
}

impl Mode {
    pub(crate) fn of(long: bool) -> Mode {
        if long { Mode::Long } else { Mode::Ci }
    }
}

/// Builds the environment of `release`, the agent and the suite, then runs the suite (also
/// used by `cargo xtask test`, with `locked`, and by `cargo xtask demo --self-hosted`).
pub(crate) fn run_suite_on(
    filters: &[String],
    locked: bool,
    mode: Mode,
    release: Release,
) -> anyhow::Result<()> {
    let started = Instant::now();
    interrupt::install()?;
    e2e_env::ensure_built_release(release)?;
    let suite = build_suite(locked)?;
    let results = results_file(release)?;
    let _ = std::fs::remove_file(&results);
    let outcome = run_binary(&suite, filters, mode, release, &results);
    // Failures are recorded too; the demo is not a run of the suite.
    if mode != Mode::Demo {
        // `abc1234`, or `abc1234+dirty` with uncommitted changes to the agent or the suite.
        let commit = match ckpt_e2e::bench::git_head() {
            (short, true) => format!("{short}+dirty"),
            (short, false) => short,
        };
        match crate::compat::record(&results, &commit) {
            Ok(table) => eprintln!("e2e: results recorded in {}", table.display()),
            Err(e) => eprintln!("e2e: results not recorded: {e:#}"),
        }
    }
    outcome?;
    if mode != Mode::Demo {
        Progress::new("e2e").say(&format!(
            "end-to-end suite passed ({} in all)",
            human_duration(started.elapsed())
        ));
    }
    Ok(())
}

/// `cargo build -p ckpt-bin` and `cargo test -p ckpt-e2e --test e2e --no-run`; returns the
/// suite's executable.
fn build_suite(locked: bool) -> anyhow::Result<PathBuf> {
    let lock_flag: &[&str] = if locked { &["--locked"] } else { &[] };
    let mut build = vec!["build", "-p", "ckpt-bin"];
    build.extend(lock_flag);
    ckpt_e2e::run("cargo", &build)?;

    let mut args = vec![
        "test",
        "-p",
        "ckpt-e2e",
        "--test",
        "e2e",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ];
    args.extend(lock_flag);
    eprintln!("$ cargo {}", args.join(" "));
    // Its stdout is the JSON messages; the diagnostics go to the terminal.
    let messages = run_command(
        Command::new("cargo")
            .args(&args)
            .current_dir(ckpt_e2e::project_root())
            .stderr(Stdio::inherit()),
    )
    .context("building the end-to-end suite failed")?;
    suite_executable(&messages).context("cargo did not report the e2e test executable")
}

/// The `executable` of the `e2e` test target in cargo's JSON messages.
fn suite_executable(messages: &str) -> Option<PathBuf> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "e2e")
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
}

/// The suite's switches for the longer mode and the demo.
const LONG_ENV: &str = "E2E_LONG";
const DEMO_ENV: &str = "E2E_DEMO";

/// Where the suite writes the results of a run on `release` (in the target dir).
fn results_file(release: Release) -> anyhow::Result<PathBuf> {
    let dir = ckpt_e2e::image::target_dir().join("e2e-results");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir.join(format!("{}.json", release.name())))
}

fn run_binary(
    suite: &PathBuf,
    args: &[String],
    mode: Mode,
    release: Release,
    results: &std::path::Path,
) -> anyhow::Result<()> {
    let switch = |on: bool| if on { "1" } else { "0" };
    let agent = agent_binary()?;
    eprintln!("$ {} {}", suite.display(), args.join(" "));
    let what = match mode {
        Mode::Demo => "the self-hosted demo",
        Mode::Ci | Mode::Long => "the end-to-end suite",
    };
    run_on_terminal(
        Command::new(suite)
            .args(args)
            .env("POD_CHECKPOINTER_BIN", &agent)
            .env(LONG_ENV, switch(mode == Mode::Long))
            .env(DEMO_ENV, switch(mode == Mode::Demo))
            .env(RELEASE_ENV, release.name())
            .env(crate::compat::RESULTS_ENV, results)
            .current_dir(ckpt_e2e::project_root()),
    )
    .with_context(|| format!("{what} failed"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_suite_executable_comes_from_the_e2e_artifact() {
        let messages = r#"{"reason":"compiler-artifact","target":{"name":"xtask"},"executable":"/t/xtask"}
not json
{"reason":"compiler-artifact","target":{"name":"e2e"},"executable":"/t/debug/deps/e2e-123"}
{"reason":"build-finished","success":true}"#;
        assert_eq!(
            suite_executable(messages),
            Some(PathBuf::from("/t/debug/deps/e2e-123"))
        );
        assert_eq!(suite_executable("{}"), None);
    }
}
