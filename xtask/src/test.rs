//! `cargo xtask test`: the README's test command and what `.ci/run` runs.

use std::time::Instant;

/// Formatting and lint gates, then every unit and integration test of the workspace.
#[derive(clap::Args)]
pub(crate) struct Test {
    /// Skip `cargo fmt --check` and clippy (for a quick local loop).
    #[arg(long)]
    no_lint: bool,
}

impl Test {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        let started = Instant::now();
        if !self.no_lint {
            crate::run("cargo", &["fmt", "--all", "--check"])?;
            crate::run(
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
        }
        crate::run("cargo", &["test", "--workspace", "--locked"])?;
        eprintln!("xtask test: all green in {:.0?}", started.elapsed());
        Ok(())
    }
}
