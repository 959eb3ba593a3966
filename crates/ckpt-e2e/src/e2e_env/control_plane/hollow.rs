//! kubemark's hollow kubelet as the plane runs it: its fixed CRI socket, its log, and the
//! root dir it leaves under `/tmp` with mounts below it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, anyhow};

use super::credentials::NODE_NAME;
use crate::command::run_command;
use crate::e2e_env::curl::{ApiEndpoint, node_ready_probe};
use crate::e2e_env::node_network::unescape_mountinfo;
use crate::e2e_env::release::Release;
use crate::process::Managed;
use crate::wait::{Probe, wait_ready};

const NODE_READY_TIMEOUT: Duration = Duration::from_secs(90);

/// kubemark 1.20 hard-codes its fake CRI (runtime.v1alpha2) socket: one hollow node per machine.
pub const CRI_SOCKET: &str = "/tmp/kubelet_remote.sock";

/// kubemark 1.20 always puts the kubelet's root dir at `/tmp/hollow-kubelet.NNN`.
const HOLLOW_ROOT_PREFIX: &str = "/tmp/hollow-kubelet.";

/// kubemark's hollow kubelet, running as [`NODE_NAME`].
pub(super) struct HollowNode {
    pub(super) process: Managed,
    /// The kubemark binary, to start it again.
    pub(super) kubemark: PathBuf,
    pub(super) kubelet_port: u16,
    pub(super) kubelet_read_only_port: u16,
    /// `/tmp/hollow-kubelet.NNN`, once read from its log.
    pub(super) root_dir: Option<PathBuf>,
}

impl HollowNode {
    /// Starts kubemark's hollow kubelet as [`NODE_NAME`] with `kubeconfig`, its log in
    /// `workdir`.
    pub(super) fn spawn(
        release: Release,
        kubemark: PathBuf,
        kubelet_port: u16,
        kubelet_read_only_port: u16,
        workdir: &Path,
        kubeconfig: &Path,
    ) -> anyhow::Result<HollowNode> {
        let mut command = Command::new(&kubemark);
        command
            .args(["--morph=kubelet", &format!("--name={NODE_NAME}")])
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--kubelet-port={kubelet_port}"))
            .arg(format!("--kubelet-read-only-port={kubelet_read_only_port}"));
        if release.hollow_uses_host_image_service() {
            // Its default from 1.2x on: pull through the host's containerd. The hollow node
            // runs no image: the fake runtime's images do.
            command.arg("--use-host-image-service=false");
        }
        let log = workdir.join(hollow_log_name());
        let process = Managed::spawn("hollow node", &mut command, &log, workdir)?;
        Ok(HollowNode {
            process,
            kubemark,
            kubelet_port,
            kubelet_read_only_port,
            root_dir: None,
        })
    }

    /// Waits for the root dir kubemark logs, records it, and links `workdir/static-pods` to
    /// the kubelet's static pod dir below it; returns the link and that dir.
    pub(super) fn link_static_pods(&mut self, workdir: &Path) -> anyhow::Result<(PathBuf, PathBuf)> {
        let log = self.process.log().to_owned();
        let (root, _) = wait_ready(
            "hollow kubelet root dir in its log",
            Duration::from_secs(30),
            &log,
            || {
                self.process.ensure_running("hollow node did not become Ready")?;
                let root = fs::read_to_string(&log)
                    .ok()
                    .and_then(|text| parse_hollow_root(&text));
                Ok(root.map_or_else(|| Probe::Waiting("not logged yet".into()), Probe::Ready))
            },
        )?;
        self.root_dir = Some(root.clone());
        let real_static_dir = fs::read_dir(&root)
            .with_context(|| format!("cannot read {}", root.display()))?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.is_dir()
                    && p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("static-pods"))
            })
            .with_context(|| format!("no static-pods* dir in {}", root.display()))?;
        let link = workdir.join("static-pods");
        std::os::unix::fs::symlink(&real_static_dir, &link)
            .with_context(|| format!("cannot link {} to {}", link.display(), real_static_dir.display()))?;
        Ok((link, real_static_dir))
    }

    /// Links [`CRI_SOCKET`] to the socket its fake runtime listens on (`socket`, a release
    /// whose kubemark does not use the fixed one), once it is there.
    pub(super) fn link_cri_socket(&mut self, socket: &Path) -> anyhow::Result<()> {
        let log = self.process.log().to_owned();
        wait_ready(
            "the hollow kubelet's fake CRI socket",
            Duration::from_secs(30),
            &log,
            || {
                self.process
                    .ensure_running("hollow node did not start its runtime")?;
                Ok(if socket.exists() {
                    Probe::Ready(())
                } else {
                    Probe::Waiting(format!("no {}", socket.display()))
                })
            },
        )?;
        let _ = fs::remove_file(CRI_SOCKET);
        std::os::unix::fs::symlink(socket, CRI_SOCKET)
            .with_context(|| format!("cannot link {CRI_SOCKET} to {}", socket.display()))
    }

    /// Waits until the API server reports the Node Ready; returns how long that took.
    pub(super) fn wait_ready(&mut self, api: &ApiEndpoint) -> anyhow::Result<Duration> {
        let log = self.process.log().to_owned();
        let node_path = format!("/api/v1/nodes/{NODE_NAME}");
        let ((), took) = wait_ready(
            &format!("Node {NODE_NAME} Ready"),
            NODE_READY_TIMEOUT,
            &log,
            || {
                self.process.ensure_running("hollow node did not become Ready")?;
                Ok(node_ready_probe(api.get(&node_path)?))
            },
        )?;
        Ok(took)
    }
}

pub(super) fn hollow_log_name() -> String {
    format!("hollow-{NODE_NAME}.log")
}

/// Removes a hollow kubelet's root dir (only one named like kubemark's). The kubelet
/// bind-mounts it on itself (to make it shared) and may mount pod volumes below: removing
/// it without unmounting failed with EBUSY and left a mount behind after every run.
pub(super) fn remove_hollow_root(root: &Path) -> anyhow::Result<()> {
    if !root.to_string_lossy().starts_with(HOLLOW_ROOT_PREFIX) {
        return Ok(());
    }
    unmount_below(root)?;
    match fs::remove_dir_all(root) {
        Err(e) if root.exists() => Err(anyhow!("cannot remove {}: {e}", root.display())),
        _ => Ok(()),
    }
}

/// Unmounts every mount at `dir` or below it, deepest first (lazily if busy).
fn unmount_below(dir: &Path) -> anyhow::Result<()> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").context("cannot read /proc/self/mountinfo")?;
    let mut points = mount_points_below(&mountinfo, dir);
    points.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    for point in points {
        let plain = Command::new("umount").arg(&point).stderr(Stdio::null()).status();
        if !plain.is_ok_and(|status| status.success()) {
            run_command(Command::new("umount").arg("-l").arg(&point))
                .with_context(|| format!("cannot unmount {}", point.display()))?;
        }
    }
    Ok(())
}

/// The mount points in `mountinfo` (`/proc/self/mountinfo`) at `dir` or below it, as
/// often as something is mounted there (stacked mounts need as many unmounts).
fn mount_points_below(mountinfo: &str, dir: &Path) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| PathBuf::from(unescape_mountinfo(field)))
        .filter(|point| point.starts_with(dir))
        .collect()
}

/// The root dir from kubemark's `Using /tmp/hollow-kubelet.NNN as root dir for hollow-kubelet`.
fn parse_hollow_root(log: &str) -> Option<PathBuf> {
    log.lines().find_map(|line| {
        let (before, _) = line.split_once(" as root dir for hollow-kubelet")?;
        let (_, dir) = before.rsplit_once("Using ")?;
        Some(PathBuf::from(dir.trim()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_below_the_hollow_kubelets_root_are_found() {
        let mountinfo = "\
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
45 27 254:0 /tmp/hollow-kubelet.29 /tmp/hollow-kubelet.29 rw,relatime shared:1 - ext4 /dev/vda rw
46 27 254:0 /tmp/hollow-kubelet.291 /tmp/hollow-kubelet.291 rw,relatime shared:2 - ext4 /dev/vda rw
47 45 0:50 / /tmp/hollow-kubelet.29/pods/a\\040b/volumes rw,relatime shared:3 - tmpfs tmpfs rw
48 45 254:0 /tmp/hollow-kubelet.29 /tmp/hollow-kubelet.29 rw,relatime shared:1 - ext4 /dev/vda rw
";
        let check = |dir: &str, expected: &[&str]| {
            let found = mount_points_below(mountinfo, Path::new(dir));
            let expected: Vec<PathBuf> = expected.iter().map(PathBuf::from).collect();
            assert_eq!(found, expected, "{dir}");
        };
        check(
            "/tmp/hollow-kubelet.29",
            &[
                "/tmp/hollow-kubelet.29",
                "/tmp/hollow-kubelet.29/pods/a b/volumes",
                "/tmp/hollow-kubelet.29",
            ],
        );
        check("/tmp/hollow-kubelet.291", &["/tmp/hollow-kubelet.291"]);
        check("/tmp/hollow-kubelet.2", &[]);
    }

    #[test]
    fn hollow_root_is_read_from_the_kubemark_log() {
        let log = "I1202 12:00:00.1 1 flags.go:59] FLAG: --v=\"2\"\n\
                   I1202 12:00:00.2 1 hollow_kubelet.go:142] Using /tmp/hollow-kubelet.123456 as root dir for hollow-kubelet\n";
        assert_eq!(
            parse_hollow_root(log),
            Some(PathBuf::from("/tmp/hollow-kubelet.123456"))
        );
        assert_eq!(parse_hollow_root("nothing yet\n"), None);
    }
}
