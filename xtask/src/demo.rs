//! `cargo xtask demo`: the narrated demo (work in progress).

/// A narrated run of the agent on a local control plane.
#[derive(clap::Args)]
pub(crate) struct Demo {}

impl Demo {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        anyhow::bail!("`cargo xtask demo` is not written yet")
    }
}
