//! `cargo xtask test`: the README's test command and what `.ci/run` runs: the documentation's
//! links, formatting, lints, each crate checked and packaged alone, the dependency policy
//! (cargo-deny: licences, bans, sources; advisories skipped, the reason printed), every
//! unit and integration test of the workspace, the Helm chart against render (helm built
//! from its Go module into the cache on first use, ~3 minutes), the agent's image (built,
//! run, imported into containerd; its arm64 build run under qemu-user), the release (`cargo xtask release` into
//! a temporary directory), then the end-to-end suite against a real control plane and a real
//! node of the newest Kubernetes release (v1.37.2, built from its Go modules into the cache
//! on first use, ~8.5 minutes on 2 cores).

use std::time::Instant;

use ckpt_e2e::e2e_env::{self, Release};
use ckpt_e2e::progress::human_duration;

/// Formatting and lint gates, unit and integration tests, then the end-to-end suite.
#[derive(clap::Args)]
pub(crate) struct Test {
    /// Skip `cargo fmt --check`, clippy, the check that each crate builds and packages
    /// alone and the dependency policy (for a quick local loop).
    #[arg(long)]
    no_lint: bool,
    /// Do not build the end-to-end control plane when it is not cached yet (~8.5 min): the
    /// end-to-end tests are then skipped, loudly. Refused when CI=true.
    #[arg(long)]
    no_e2e_build: bool,
    /// The longer mode: also the end-to-end scenarios kept out of CI for time (the agent's
    /// upgrade on the real node under every GC strategy, not only grace-period), and the
    /// whole suite again on v1.34.4 (from its Go modules) and on v1.20.2 (Debian's source
    /// build).
    #[arg(long)]
    long: bool,
}

/// Runs one phase and prints how long it took.
/// One of ckpt-e2e's `test = false` integration tests (they build images, need root),
/// with its progress shown.
fn e2e_crate_test(name: &str) -> anyhow::Result<()> {
    ckpt_e2e::run(
        "cargo",
        &[
            "test",
            "-p",
            "ckpt-e2e",
            "--test",
            name,
            "--locked",
            "--",
            "--nocapture",
        ],
    )
}

fn phase(name: &str, run: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<()> {
    let started = Instant::now();
    eprintln!("xtask test: phase {name}");
    run()?;
    eprintln!(
        "xtask test: phase {name} passed in {}",
        human_duration(started.elapsed())
    );
    Ok(())
}

impl Test {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        let started = Instant::now();
        let ci = std::env::var("CI").is_ok_and(|v| v == "true");
        anyhow::ensure!(
            !(ci && self.no_e2e_build),
            "--no-e2e-build is refused when CI=true: CI runs the end-to-end tests, never skips them"
        );
        // First: it takes a second, and a broken link fails as surely as a failed test.
        phase("documentation links", || {
            crate::doclinks::run(&ckpt_e2e::project_root())
        })?;
        if !self.no_lint {
            phase("fmt", || ckpt_e2e::run("cargo", &["fmt", "--all", "--check"]))?;
            phase("clippy", || {
                ckpt_e2e::run(
                    "cargo",
                    &[
                        "clippy",
                        "--workspace",
                        "--all-targets",
                        "--locked",
                        "--",
                        "-D",
                        "warnings",
                    ],
                )?;
                // `--all-targets` leaves out the `test = false` targets.
                ckpt_e2e::run(
                    "cargo",
                    &[
                        "clippy", "-p", "ckpt-e2e", "--test", "e2e", "--test", "image", "--test", "release",
                        "--test", "chart", "--locked", "--", "-D", "warnings",
                    ],
                )
            })?;
            phase("each crate alone", || {
                crate::standalone::run(&ckpt_e2e::project_root()).map(drop)
            })?;
            // deny.toml: the licences, bans and sources of every crate in Cargo.lock
            // (cargo-deny, installed once into the cache); the advisories are skipped with
            // the reason printed.
            phase("dependency policy (cargo deny)", crate::deny::run)?;
        }
        phase("unit and integration tests", || {
            ckpt_e2e::run("cargo", &["test", "--workspace", "--locked"])
        })?;
        // The Helm chart against render, with helm built from its Go module (cached).
        phase("Helm chart", || e2e_crate_test("chart"))?;
        // The image: the static release build, its root filesystem, a private containerd.
        phase("image", || e2e_crate_test("image"))?;
        // The release (`cargo xtask release` into a temporary directory): the image test
        // built both static agents, so what is left is cargo-cyclonedx (installed once into
        // the cache) and the archive.
        phase("release", || e2e_crate_test("release"))?;

        if self.no_e2e_build
            && let Err(missing) = e2e_env::cached_bins(Release::default())
        {
            eprintln!(
                "\n################################################################\n\
                 # END-TO-END TESTS SKIPPED (--no-e2e-build): {missing:#}\n\
                 # Build the control plane once with `cargo xtask e2e-env build`.\n\
                 ################################################################"
            );
            eprintln!(
                "xtask test: green WITHOUT the end-to-end tests in {}",
                human_duration(started.elapsed())
            );
            return Ok(());
        }
        // CI runs the newest release; the longer mode also the oldest from 1.34 on (the
        // first kubelet that refuses static pods referencing API objects), from its Go
        // modules, and the legacy one, v1.20.2 from Debian's source (~15 min more to build
        // cold), where every scenario still applies.
        let mut releases = vec![Release::default()];
        if self.long {
            releases.extend([Release::V1_34, Release::V1_20]);
        }
        for release in releases {
            phase(&format!("end-to-end on {release}"), || {
                crate::e2e::run_suite_on(&[], true, crate::e2e::Mode::of(self.long), release)
            })?;
        }
        eprintln!("xtask test: all green in {}", human_duration(started.elapsed()));
        Ok(())
    }
}
