//! The node's processes, found from what the node owns rather than by name: every process in
//! the node's mount namespace (kubelet, containerd, the shims, runc and CNI plugins while they
//! run) or network namespace (host-network containers), and all their descendants (the
//! containers, which have mount namespaces of their own). Killing them is the power cut of
//! a "reboot"; the cgroups runc made for the containers go with them, as on a real reboot.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::bail;

use crate::process::{all_pids, is_alive, parent_pid, send_signals};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The namespaces that make a process the node's: their inode numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct NodeNamespaces {
    pub(super) mnt: Option<u64>,
    pub(super) net: Option<u64>,
}

impl NodeNamespaces {
    fn owns(&self, pid: u32) -> bool {
        let matches = |kind: &str, wanted: Option<u64>| {
            wanted.is_some_and(|inode| namespace_inode(pid, kind) == Some(inode))
        };
        matches("mnt", self.mnt) || matches("net", self.net)
    }
}

/// The inode of the namespace pinned at `pin` (an nsfs bind mount), if it is pinned.
pub(super) fn pinned_inode(pin: &Path) -> Option<u64> {
    let metadata = fs::metadata(pin).ok()?;
    // An unpinned pin file is an empty regular file on the parent file system; a pinned one
    // lives on nsfs, whose device differs from its directory's.
    let parent = fs::metadata(pin.parent()?).ok()?;
    (metadata.dev() != parent.dev()).then_some(metadata.ino())
}

/// The inode of `/proc/PID/ns/KIND` (`mnt:[4026532281]`).
pub(super) fn namespace_inode(pid: u32, kind: &str) -> Option<u64> {
    let link = fs::read_link(format!("/proc/{pid}/ns/{kind}")).ok()?;
    parse_namespace_link(&link.to_string_lossy())
}

fn parse_namespace_link(link: &str) -> Option<u64> {
    let (_, rest) = link.split_once(":[")?;
    rest.strip_suffix(']')?.parse().ok()
}

/// Every live process of the node: those in its namespaces, `roots` (its recorded daemons)
/// and all their descendants. Never this process or its ancestors.
pub(super) fn node_processes(namespaces: NodeNamespaces, roots: &[u32]) -> BTreeSet<u32> {
    let pids = all_pids();
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for &pid in &pids {
        if let Some(parent) = parent_pid(pid) {
            children.entry(parent).or_default().push(pid);
        }
    }
    let mut found: BTreeSet<u32> = pids
        .iter()
        .copied()
        .filter(|pid| namespaces.owns(*pid))
        .chain(roots.iter().copied())
        .collect();
    let mut queue: Vec<u32> = found.iter().copied().collect();
    while let Some(pid) = queue.pop() {
        for &child in children.get(&pid).into_iter().flatten() {
            if found.insert(child) {
                queue.push(child);
            }
        }
    }
    let mut protected = BTreeSet::new();
    let mut pid = Some(std::process::id());
    while let Some(current) = pid.filter(|p| *p > 1 && protected.insert(*p)) {
        pid = parent_pid(current);
    }
    found
        .into_iter()
        .filter(|pid| *pid > 1 && !protected.contains(pid) && is_alive(*pid))
        .collect()
}

/// The cgroups of `pids` that are not this process's own: those runc made for containers
/// (the daemons inherit ours).
pub(super) fn container_cgroups(pids: &BTreeSet<u32>) -> BTreeSet<String> {
    let own = cgroups_of(std::process::id());
    pids.iter()
        .flat_map(|pid| cgroups_of(*pid))
        .filter(|cgroup| !own.contains(cgroup))
        .collect()
}

/// SIGKILLs every node process until none is left (a dying container may have forked);
/// returns the cgroups of the containers among them.
pub(super) fn kill_all(namespaces: NodeNamespaces, roots: &[u32]) -> anyhow::Result<BTreeSet<String>> {
    let mut cgroups = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let pids = node_processes(namespaces, roots);
        if pids.is_empty() {
            return Ok(cgroups);
        }
        if Instant::now() >= deadline {
            bail!("node processes survive SIGKILL: {pids:?}");
        }
        cgroups.extend(container_cgroups(&pids));
        send_signals(&pids.iter().copied().collect::<Vec<_>>(), "KILL")?;
        sleep(Duration::from_millis(50));
    }
}

/// The cgroup paths of `pid` (the third field of `/proc/PID/cgroup`), of every hierarchy.
fn cgroups_of(pid: u32) -> BTreeSet<String> {
    fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map(|text| parse_cgroups(&text))
        .unwrap_or_default()
}

fn parse_cgroups(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|line| line.splitn(3, ':').nth(2))
        .filter(|path| *path != "/")
        .map(str::to_owned)
        .collect()
}

/// Removes the (now empty) cgroups of killed containers, and their parents once empty
/// (runc's `/k8s.io`), in every hierarchy; returns those that are left.
pub(super) fn remove_cgroups(cgroups: &BTreeSet<String>) -> Vec<PathBuf> {
    let hierarchies = cgroup_hierarchies();
    let mut dirs: BTreeSet<PathBuf> = BTreeSet::new();
    for cgroup in cgroups {
        let relative = cgroup.trim_start_matches('/');
        for hierarchy in &hierarchies {
            let dir = hierarchy.join(relative);
            if dir.is_dir() {
                dirs.insert(dir.clone());
                if let Some(parent) = dir.parent().filter(|p| p != &hierarchy.as_path()) {
                    dirs.insert(parent.to_owned());
                }
            }
        }
    }
    // Deepest first; a parent that still has other children stays.
    let mut ordered: Vec<PathBuf> = dirs.into_iter().collect();
    ordered.sort_by_key(|dir| std::cmp::Reverse(dir.components().count()));
    let mut left = Vec::new();
    for dir in ordered {
        if fs::remove_dir(&dir).is_err() && dir.is_dir() && cgroups_contain(cgroups, &dir) {
            left.push(dir);
        }
    }
    left
}

/// Whether `dir` is one of the containers' cgroups themselves (not a shared parent).
fn cgroups_contain(cgroups: &BTreeSet<String>, dir: &Path) -> bool {
    cgroups
        .iter()
        .any(|cgroup| dir.ends_with(cgroup.trim_start_matches('/')))
}

/// The mounted cgroup hierarchies: each dir of /sys/fs/cgroup on cgroup v1 (hybrid included),
/// /sys/fs/cgroup itself on a unified v2 host.
pub(super) fn cgroup_hierarchies() -> Vec<PathBuf> {
    let root = Path::new(CGROUP_ROOT);
    if root.join("cgroup.controllers").exists() {
        return vec![root.to_owned()];
    }
    fs::read_dir(root)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir() && !p.is_symlink())
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until none of `pids` is alive (a zombie is not).
pub(super) fn wait_gone(pids: &[u32], timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while pids.iter().any(|pid| is_alive(*pid)) {
        if Instant::now() >= deadline {
            return false;
        }
        sleep(Duration::from_millis(20));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_links_give_their_inode() {
        assert_eq!(parse_namespace_link("mnt:[4026532281]"), Some(4_026_532_281));
        assert_eq!(parse_namespace_link("net:[1]"), Some(1));
        assert_eq!(parse_namespace_link("garbage"), None);
        let me = std::process::id();
        assert!(namespace_inode(me, "mnt").is_some());
    }

    #[test]
    fn cgroup_lines_give_their_paths_but_the_root() {
        let text = "12:pids:/k8s.io/abc\n1:name=systemd:/k8s.io/abc\n0::/\n3:memory:/user.slice/x\n";
        let cgroups = parse_cgroups(text);
        assert_eq!(
            cgroups.into_iter().collect::<Vec<_>>(),
            ["/k8s.io/abc", "/user.slice/x"]
        );
    }

    #[test]
    fn this_process_is_never_a_node_process() {
        let me = std::process::id();
        let mine = NodeNamespaces {
            mnt: namespace_inode(me, "mnt"),
            net: None,
        };
        let found = node_processes(mine, &[me]);
        assert!(!found.contains(&me));
        assert!(!found.contains(&1));
        let none = node_processes(NodeNamespaces::default(), &[]);
        assert!(none.is_empty());
    }

    #[test]
    fn an_unpinned_file_has_no_namespace() {
        let pin = std::env::temp_dir().join(format!("xtask-pin-{}", crate::process::random_hex(4).unwrap()));
        fs::write(&pin, "").unwrap();
        assert_eq!(pinned_inode(&pin), None);
        assert_eq!(pinned_inode(&pin.join("missing")), None);
        fs::remove_file(&pin).unwrap();
    }
}
