//! What the end-to-end suite, `cargo xtask bench` and `cargo xtask demo` drive the agent
//! with, on top of a [`ControlPlane`](crate::e2e_env::ControlPlane):
//!
//! - [`testbed`]: the plane with its hollow node and the clients below, as all three use it:
//!   namespaces with the agent's rights, the checkpointer's pod and its parents, agents
//!   configured for the node, the API server taken away and brought back;
//! - [`agent`]: `pod-checkpointer run` as a real process with a debug log in the work dir,
//!   its health endpoints, `inspect -o json` and `drain`;
//! - [`kubectl`]: the API server through kubectl (JSON in and out);
//! - [`lock`]: who holds the agent's lock on a node, watched from the host without taking
//!   part;
//! - [`objects`]: the pods, Secrets, ConfigMaps, DaemonSets and RBAC objects the scenarios
//!   create, as JSON;
//! - [`expect`]: the expectations on those sources (the hollow kubelet's runtime through
//!   [`cri`](crate::e2e_env::cri) among them), each a bounded poll ([`wait`](crate::wait)).

pub mod agent;
pub mod expect;
pub mod kubectl;
pub mod lock;
pub mod objects;
pub mod testbed;

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::Value;

/// The `pod-checkpointer` binary next to the running executable: `target/<profile>/` holds
/// both `xtask` and `pod-checkpointer`, and an integration test runs from its `deps/` subdir.
/// `POD_CHECKPOINTER_BIN` overrides.
pub fn agent_binary() -> anyhow::Result<PathBuf> {
    sibling_binary(
        "pod-checkpointer",
        "POD_CHECKPOINTER_BIN",
        "build it with `cargo build -p ckpt-bin` (`cargo xtask e2e` does)",
    )
}

/// The `xtask` binary (what `cargo xtask` runs), found like [`agent_binary`]; `XTASK_BIN`
/// overrides. The real-node scenarios run `deploy` with it, as an operator would.
pub fn xtask_binary() -> anyhow::Result<PathBuf> {
    sibling_binary(
        "xtask",
        "XTASK_BIN",
        "build it with `cargo build -p xtask` (`cargo xtask e2e` runs from it)",
    )
}

fn sibling_binary(name: &str, override_var: &str, how_to_build: &str) -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os(override_var).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        anyhow::ensure!(path.is_file(), "{override_var}={} does not exist", path.display());
        return Ok(path);
    }
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    let path = dir.join(name);
    anyhow::ensure!(
        path.is_file(),
        "{} does not exist: {how_to_build}, or set {override_var}",
        path.display()
    );
    Ok(path)
}

/// Files under `dir` (recursively), relative to it, sorted; empty when it does not exist.
/// In a checkpoint's volume directory these are the keys the pod sees: the `..`-named
/// version directories and `..data` link behind them are left out.
pub fn files_under(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        let Ok(entries) = fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            if entry.file_name().as_encoded_bytes().starts_with(b"..") {
                continue;
            }
            if path.is_dir() {
                walk(root, &path, out);
            } else if let Ok(relative) = path.strip_prefix(root) {
                out.push(relative.display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// Reads a checkpoint manifest (compact JSON ending in a newline, ARCHITECTURE.md, Command-line contract).
pub fn read_manifest(path: &Path) -> anyhow::Result<Value> {
    let text = fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    anyhow::ensure!(
        text.ends_with('\n'),
        "{} does not end with a newline",
        path.display()
    );
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))
}
