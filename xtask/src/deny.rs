//! `cargo xtask deny`, and the phase "dependency policy (cargo deny)" of `cargo xtask test`:
//! cargo-deny checks every crate of Cargo.lock against `deny.toml`: the licences it allows,
//! the bans (no `*` requirement on a registry crate; duplicate versions listed, not failed)
//! and the sources (crates.io only). The advisories are not checked here: they need the
//! RustSec database, a git repository this machine cannot fetch (it reaches crates.io and
//! no other site), so the check says so instead of passing silently.

use anyhow::Context as _;
use ckpt_e2e::cargo_tool::CargoTool;
use ckpt_e2e::command::{command_line, run_on_terminal};
use ckpt_e2e::progress::Progress;

/// cargo-deny, pinned: what `cargo install --locked` builds once into the cache (~4 min on
/// 2 cores).
pub(crate) const DENY_TOOL: CargoTool = CargoTool {
    krate: "cargo-deny",
    version: "0.20.2",
    program: "cargo-deny",
};

/// Why the advisories are not checked, and how to check them: printed on every run.
const ADVISORIES_SKIPPED: &str = "advisories SKIPPED: the advisory database \
    (github.com/rustsec/advisory-db) cannot be fetched from this machine; where it can, run \
    `cargo deny check advisories`";

/// Checks the dependency policy of deny.toml (licences, bans, sources), and nothing else.
#[derive(clap::Args)]
pub(crate) struct Deny {}

impl Deny {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        run()
    }
}

/// Runs `cargo deny check licenses bans sources` offline in the project root; fails on any
/// violation, naming the crate and the rule in cargo-deny's own output.
pub(crate) fn run() -> anyhow::Result<()> {
    let progress = Progress::new("deny");
    progress.say(ADVISORIES_SKIPPED);
    // cargo-deny reads the graph through `cargo metadata`, which needs every crate of the
    // lock file, for every target (the builds fetched only the host's): fetched here, a
    // no-op once they are all in cargo's cache, so cargo-deny itself can run offline.
    ckpt_e2e::run("cargo", &["fetch", "--locked"])?;
    let mut deny = DENY_TOOL.command(progress)?;
    deny.args(["--offline", "--locked", "check"])
        // One location per finding rather than the path from each workspace crate to it
        // (~1,000 lines for today's duplicates); `cargo deny check` without it shows them.
        .arg("--hide-inclusion-graph")
        .args(["licenses", "bans", "sources"])
        .current_dir(ckpt_e2e::project_root());
    eprintln!("$ {}", command_line(&deny));
    run_on_terminal(&mut deny).with_context(|| {
        format!(
            "the dependencies break deny.toml's policy (cargo-deny's errors above); `{} \
             check licenses bans sources` shows which crates pull each one in",
            DENY_TOOL.path().display()
        )
    })
}
