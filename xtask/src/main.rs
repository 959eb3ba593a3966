//! See <https://github.com/matklad/cargo-xtask/>.
//!
//! Developer and operator tasks for pod-checkpointer, run as `cargo xtask <task>`:
//! `test` runs everything CI runs; `e2e` runs the end-to-end suite against a real control
//! plane; `bench` measures the image's agent against one; `demo` narrates the agent at work
//! on one (`--self-hosted`: a self-hosted control plane through a power cut); `e2e-env`
//! builds, starts and stops that control plane by hand; `image` builds the agent's OCI image
//! archive; `release` builds everything a release publishes into `dist/`; `fuzz` runs the
//! fuzz targets; `doclinks` checks the documentation's links; `deny` the dependency policy
//! (cargo-deny against `deny.toml`); `render` and `deploy` install the agent. One module
//! per subcommand; each is a struct with a `run` method. The end-to-end infrastructure
//! (control plane, harness, suite, bench, demo, image and release builders) lives in the
//! `ckpt-e2e` crate; xtask dispatches to it.

mod compat;
mod demo;
mod deny;
mod deploy;
mod doclinks;
mod e2e;
mod fuzz;
mod render;
mod standalone;
mod test;

use ckpt_e2e::{bench, e2e_env, image, release};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "pod-checkpointer developer and operator tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Formatting, lints, unit, integration and end-to-end tests: what CI runs.
    Test(test::Test),
    /// Build the control plane and the agent, then run the end-to-end suite against them.
    E2e(e2e::E2e),
    /// A narrated run of the agent on a local control plane: checkpoint, API server down,
    /// activation, recovery, deactivation, garbage collection; with --self-hosted, a
    /// self-hosted control plane on a real node through a power cut.
    Demo(demo::Demo),
    /// The real kube-apiserver, etcd and hollow kubelet for the end-to-end tests.
    E2eEnv(e2e_env::E2eEnv),
    /// End-to-end benchmarks of the image's agent against the real control plane: latency,
    /// footprint and API load (ARCHITECTURE.md, Targets); writes target/bench/e2e-<timestamp>.{json,md}.
    Bench(bench::Bench),
    /// Write the manifests that install pod-checkpointer (ServiceAccount, RBAC, config,
    /// DaemonSet) as YAML.
    Render(render::Render),
    /// Install or update pod-checkpointer in a cluster (server-side apply) and wait for
    /// the rollout.
    Deploy(deploy::Deploy),
    /// Run the coverage-guided fuzz targets of fuzz/ (cargo-fuzz, nightly) for a while each:
    /// the long part of the fuzzing CI does as a bounded property run.
    Fuzz(fuzz::Fuzz),
    /// Build the agent's OCI image archive (static binary, minimal image) without a
    /// container engine; prints its path and digest.
    Image(image::Image),
    /// Check that every relative link and #anchor in the repository's Markdown files
    /// resolves (the first phase of `test`).
    Doclinks(doclinks::Doclinks),
    /// Check the dependency policy of deny.toml with cargo-deny (licences, bans, sources;
    /// the advisories need a database this machine cannot fetch): a phase of `test`.
    Deny(deny::Deny),
    /// Build everything a release publishes into dist/: the agent's image for linux/amd64
    /// and linux/arm64 as one OCI archive, its binaries, the install YAML pinned to the
    /// image's digest, an SBOM, the release notes, SHA256SUMS.
    Release(release::Release),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.task {
        Task::Test(cmd) => cmd.run(),
        Task::E2e(cmd) => cmd.run(),
        Task::Demo(cmd) => cmd.run(),
        Task::E2eEnv(cmd) => cmd.run(),
        Task::Bench(cmd) => cmd.run(),
        Task::Render(cmd) => cmd.run(),
        Task::Deploy(cmd) => cmd.run(),
        Task::Image(cmd) => cmd.run(),
        Task::Release(cmd) => cmd.run(),
        Task::Fuzz(cmd) => cmd.run(),
        Task::Doclinks(cmd) => cmd.run(),
        Task::Deny(cmd) => cmd.run(),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// clap checks its own definition (unique names, valid conflicts) only when parsing:
    /// check every subcommand here instead of on a user's first run.
    #[test]
    fn the_command_line_is_well_formed() {
        super::Cli::command().debug_assert();
    }
}
