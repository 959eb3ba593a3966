//! The node's two built-in images, written by [`crate::image`] and imported into containerd's
//! `k8s.io` namespace (the one its CRI plugin serves):
//!
//! - [`PAUSE_IMAGE`]: the pause binary the build compiles from the Kubernetes source, the
//!   sandbox of every pod;
//! - [`BUSYBOX_IMAGE`]: Debian's static busybox, for test pods.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;

use crate::command::run_command;
use crate::image;

pub use crate::image::{BUSYBOX_IMAGE, PAUSE_IMAGE};

/// `ctr images import` of an OCI (or Docker) archive into the `k8s.io` namespace of the
/// containerd at `socket` (a host path), unpacked for the default snapshotter.
pub(super) fn import(ctr: &Path, socket: &Path, archive: &Path) -> anyhow::Result<()> {
    run_command(
        Command::new(ctr)
            .arg("--address")
            .arg(socket)
            .args(["--namespace", "k8s.io", "images", "import"])
            .arg(archive),
    )
    .with_context(|| format!("cannot import {}", archive.display()))
    .map(drop)
}

/// Writes the built-in images into `dir`; returns their archives.
pub(super) fn write_builtin(dir: &Path, pause_binary: &Path) -> anyhow::Result<Vec<PathBuf>> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let pause = dir.join("pause.tar");
    image::pause_image(pause_binary, &pause)?;
    let busybox = dir.join("busybox.tar");
    image::busybox_image(&busybox)?;
    Ok(vec![pause, busybox])
}
