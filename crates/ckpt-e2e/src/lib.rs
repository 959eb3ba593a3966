//! The end-to-end infrastructure of pod-checkpointer, behind `cargo xtask` (publish = false):
//! what the end-to-end suite (`tests/e2e`), the bench and the demo share.
//!
//! The modules stand in layers, and a module imports only from its own layer or lower ones:
//!
//! 1. shared utilities: [`progress`] (the progress lines every command prints on stderr, and
//!    durations), [`command`] (running a command to completion: status checked, stderr in
//!    the error), [`process`] (long-running children, signals, `/proc`, log tails),
//!    [`interrupt`] (Ctrl-C stops the waits, so the normal clean-up runs) and [`wait`]
//!    (bounded polling that says what was expected and what was seen);
//! 2. what the environment is built from: [`apt`] (the Debian packages the tasks install
//!    when missing) and [`image`] (`cargo xtask image`: OCI image archives built without a
//!    container engine: the agent's, the pause image, a busybox for test pods);
//! 3. the environment, [`e2e_env`]: the build of Kubernetes v1.20.2, then the control plane
//!    (kube-apiserver, etcd and kubemark's hollow kubelet; kill, pause or restart its API
//!    server), then the real node (kubelet, containerd and runc in namespaces of its own);
//!    beside it [`promtool`], Prometheus' rule checker (for the alerts `render --prometheus`
//!    writes), [`chart`], the Helm chart templated by helm (built from its Go module) and
//!    packaged, and [`cargo_tool`], programs from crates.io (the SBOM generator), kept in
//!    the environment's cache;
//! 4. [`harness`]: what drives the agent against the environment: `pod-checkpointer`
//!    processes with their logs, kubectl, the Kubernetes objects the scenarios create, the
//!    expectations, and [`harness::testbed::Testbed`], the one plane harness;
//! 5. on top: [`self_hosted`] (a self-hosted control plane on the real node, pivoted from the
//!    plane's), [`bench`] (`cargo xtask bench`: latency, footprint and API load of the
//!    release agent; with `--fleet`, of a fleet of them against one API server), [`demo`] (`cargo xtask demo`: the agent at work, narrated) and [`release`] (`cargo xtask release`: the artifacts a release publishes, into `dist/`).
//!
//! A new scenario goes into the suite (`tests/e2e`) and uses the harness; what several
//! scenarios need from the agent's side goes into [`harness`]. A new piece of the
//! environment goes into [`e2e_env`] at its layer: the control plane's concerns into
//! `e2e_env/control_plane/`, the node's into `e2e_env/real_node/`, a client both use beside
//! them (like `curl`); never an import from a lower layer of a higher one.
//!
//! ```no_run
//! use ckpt_e2e::e2e_env::{ControlPlane, StartOptions, ensure_built};
//!
//! let bins = ensure_built()?;
//! let plane = ControlPlane::start(&StartOptions { hollow_node: true, ..StartOptions::new(bins) })?;
//! println!("API server at {}", plane.kubeconfig().display());
//! # anyhow::Ok(())
//! ```

use std::path::PathBuf;

// In layers, lowest first: a module imports only from its own layer or those before it.
// Shared utilities: progress lines and durations, commands, processes, Ctrl-C, waiting.
pub mod command;
pub mod interrupt;
pub mod process;
pub mod progress;
pub mod wait;

// What the environment is built from: Debian packages and OCI images.
pub mod apt;
pub mod image;

// The environment: its build, the control plane, the real node; promtool, helm and the
// chart, and the tools from crates.io in its cache.
pub mod cargo_tool;
pub mod chart;
pub mod e2e_env;
pub mod promtool;

// What drives the agent against the environment.
pub mod harness;

// What runs on the harness: the self-hosted control plane, the bench, the demo; and the
// release, built from the images and the cached tools.
pub mod bench;
pub mod demo;
pub mod release;
pub mod self_hosted;

/// The workspace root (this crate is `crates/ckpt-e2e`), where cargo builds the agent.
pub fn project_root() -> PathBuf {
    let manifest_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .ancestors()
        .nth(2)
        .unwrap_or(manifest_dir)
        .to_path_buf()
}

/// Whether a test that needs root may go on: `true` as root; otherwise it says it is
/// skipped (`why`: what needs root) and returns `false`, except with CI=true, where it
/// panics: CI runs as root and skips nothing (ARCHITECTURE.md, Testing).
pub fn root_or_skip(why: &str) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    if std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0) {
        return true;
    }
    assert_ne!(
        std::env::var("CI").as_deref(),
        Ok("true"),
        "this test needs root ({why})"
    );
    eprintln!("skipped: {why} needs root");
    false
}

/// Runs `program args…` in the project root on the terminal, echoing it first.
pub fn run(program: &str, args: &[&str]) -> anyhow::Result<()> {
    eprintln!("$ {program} {}", args.join(" "));
    command::run_on_terminal(
        std::process::Command::new(program)
            .args(args)
            .current_dir(project_root()),
    )
}
