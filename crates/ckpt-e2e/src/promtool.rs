//! `promtool`, Prometheus' rule checker and rule unit-test runner, for the test of the
//! alerts `render --prometheus` writes. Taken from Debian's `prometheus` package without
//! installing it (installing would start a Prometheus server): the package is downloaded
//! and `usr/bin/promtool` (a static Go binary) extracted into the cache.

use std::path::PathBuf;
use std::process::Command;

use anyhow::Context;

use crate::apt::Apt;
use crate::e2e_env::cache_root;
use crate::image::target_dir;
use crate::progress::Progress;

const PROGRESS: Progress = Progress::new("promtool");

/// The cached `promtool`, downloaded and extracted on first use.
pub fn promtool() -> anyhow::Result<PathBuf> {
    let dir = cache_root().join("promtool");
    let path = dir.join("promtool");
    if works(&path) {
        return Ok(path);
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let work = tempfile_dir(&dir)?;
    let log = target_dir().join("promtool-apt.log");
    if let Some(parent) = log.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    }
    let mut apt = Apt::new(log, PROGRESS);
    apt.update()?;
    PROGRESS.say("apt-get download prometheus (for its promtool) …");
    let status = Apt::command(&["download", "prometheus"])
        .current_dir(&work)
        .status()
        .context("cannot run apt-get download")?;
    anyhow::ensure!(status.success(), "apt-get download prometheus failed: {status}");
    let deb = std::fs::read_dir(&work)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .context("apt-get download left no .deb")?;
    let unpacked = work.join("unpacked");
    let status = Command::new("dpkg-deb")
        .arg("-x")
        .arg(&deb)
        .arg(&unpacked)
        .status()
        .context("cannot run dpkg-deb")?;
    anyhow::ensure!(status.success(), "dpkg-deb -x {} failed: {status}", deb.display());
    // Into place by rename, so a half-copied binary is never taken for a cached one.
    let staged = dir.join(".promtool.tmp");
    std::fs::copy(unpacked.join("usr/bin/promtool"), &staged)
        .context("the package holds no usr/bin/promtool")?;
    std::fs::rename(&staged, &path)?;
    std::fs::remove_dir_all(&work).ok();
    anyhow::ensure!(works(&path), "{} does not run", path.display());
    PROGRESS.say(&format!("promtool cached at {}", path.display()));
    Ok(path)
}

fn works(path: &std::path::Path) -> bool {
    Command::new(path)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A fresh work directory beside the cache (apt's sandbox user must be able to write it,
/// hence 0777 like apt's own partial dirs; removed afterwards).
fn tempfile_dir(parent: &std::path::Path) -> anyhow::Result<PathBuf> {
    let dir = parent.join(format!("work-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))?;
    Ok(dir)
}
