//! The end-to-end infrastructure of pod-checkpointer, behind `cargo xtask` (publish = false):
//! what the end-to-end suite (`tests/e2e`), the bench and the demo share.
//!
//! - [`e2e_env`]: build, start and stop the real control plane (kube-apiserver v1.20.2, etcd
//!   and kubemark's hollow kubelet, or a real node: kubelet, containerd and runc in
//!   namespaces of its own) and kill, pause or restart its API server;
//! - [`harness`]: what drives the agent against it: `pod-checkpointer` processes with their
//!   logs, kubectl, the hollow kubelet's CRI, the Kubernetes objects the scenarios create
//!   ([`harness::testbed::Testbed`], the one plane harness), bounded polling and Ctrl-C
//!   handling;
//! - [`bench`] (`cargo xtask bench`): latency, footprint and API load of the release agent;
//! - [`demo`] (`cargo xtask demo`): the agent at work, narrated;
//! - [`image`] (`cargo xtask image`): OCI image archives built without a container engine
//!   (the agent's, the pause image, a busybox for test pods);
//! - [`apt`]: the Debian packages the tasks install when missing;
//! - [`progress`]: the progress lines every command prints on stderr;
//! - [`promtool`]: Prometheus' rule checker, for the alerts `render --prometheus` writes;
//! - [`self_hosted`]: a self-hosted control plane on the real node, pivoted from the plane's.
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

pub mod apt;
pub mod bench;
pub mod demo;
pub mod e2e_env;
pub mod harness;
pub mod image;
pub mod progress;
pub mod promtool;
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

/// Runs `program args…` in the project root, echoing it first; fails on a non-zero exit.
pub fn run(program: &str, args: &[&str]) -> anyhow::Result<()> {
    eprintln!("$ {program} {}", args.join(" "));
    let status = std::process::Command::new(program)
        .args(args)
        .current_dir(project_root())
        .status()
        .map_err(|e| anyhow::anyhow!("cannot start {program}: {e}"))?;
    anyhow::ensure!(
        status.success(),
        "`{program} {}` failed: {status}",
        args.join(" ")
    );
    Ok(())
}
