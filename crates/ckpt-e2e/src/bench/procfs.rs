//! The agent's footprint from `/proc/PID/{status,stat,io}`, and the machine's load.

use std::fs;

use crate::process::stat_fields;
use anyhow::Context;

/// One look at a process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ProcSample {
    pub(crate) rss_kib: u64,
    /// The part of VmRSS that is heap, stacks and other private memory (`RssAnon`); the rest
    /// is mapped files (the binary's pages, `RssFile`) and shared memory.
    pub(crate) rss_anon_kib: u64,
    pub(crate) rss_file_kib: u64,
    /// Peak RSS so far.
    pub(crate) hwm_kib: u64,
    pub(crate) threads: u64,
    /// utime + stime, in clock ticks.
    pub(crate) cpu_ticks: u64,
    /// Bytes the process caused to be written to storage (`/proc/PID/io`).
    pub(crate) write_bytes: u64,
}

pub(crate) fn sample(pid: u32) -> anyhow::Result<ProcSample> {
    let read = |file: &str| {
        fs::read_to_string(format!("/proc/{pid}/{file}"))
            .with_context(|| format!("cannot read /proc/{pid}/{file} (has the agent exited?)"))
    };
    let status = read("status")?;
    let field =
        |name: &str| status_field(&status, name).with_context(|| format!("no {name} in /proc/{pid}/status"));
    Ok(ProcSample {
        rss_kib: field("VmRSS")?,
        rss_anon_kib: field("RssAnon")?,
        rss_file_kib: field("RssFile")?,
        hwm_kib: field("VmHWM")?,
        threads: field("Threads")?,
        cpu_ticks: cpu_ticks(&read("stat")?).with_context(|| format!("bad /proc/{pid}/stat"))?,
        write_bytes: io_field(&read("io")?, "write_bytes").unwrap_or(0),
    })
}

/// `Name:   123 kB` → 123.
fn status_field(status: &str, name: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let value = line.strip_prefix(name)?.strip_prefix(':')?;
        value.split_whitespace().next()?.parse().ok()
    })
}

/// utime + stime: fields 14 and 15 of `stat`.
fn cpu_ticks(stat: &str) -> Option<u64> {
    let fields = stat_fields(stat)?;
    // fields[0] is field 3 (state).
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

fn io_field(io: &str, name: &str) -> Option<u64> {
    io.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
}

/// Clock ticks per second (`getconf CLK_TCK`, 100 on Linux unless configured otherwise).
pub(crate) fn clock_ticks_per_second() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8_lossy(&out.stdout).trim().parse().ok())
        .unwrap_or(100)
}

/// A process's CPU time to the nanosecond, every thread's, exited ones included: a cgroup
/// of its own (cgroup v1's `cpuacct.usage`, or v2's `cpu.stat` `usage_usec`), made for the
/// bench and removed when dropped (once the process is gone). `/proc/PID/stat` counts whole
/// clock ticks (10 ms): at 0.6 ms of CPU a second, a 2-minute window's figure moves by a
/// third with one tick at each end.
pub(crate) struct CpuAccount {
    dir: std::path::PathBuf,
    version: CgroupVersion,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CgroupVersion {
    V1,
    V2,
}

impl CpuAccount {
    /// Moves `pid` (all its threads) into a new cgroup named `name`; `None` where no cgroup
    /// can be made (not root, no cpuacct hierarchy): the bench then counts ticks.
    pub(crate) fn enter(pid: u32, name: &str) -> Option<CpuAccount> {
        let v1 = std::path::Path::new("/sys/fs/cgroup/cpuacct");
        let (root, version) = if v1.join("cpuacct.usage").exists() {
            (v1.to_path_buf(), CgroupVersion::V1)
        } else if std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            (std::path::PathBuf::from("/sys/fs/cgroup"), CgroupVersion::V2)
        } else {
            return None;
        };
        let dir = root.join(name);
        let _ = fs::remove_dir(&dir);
        fs::create_dir(&dir).ok()?;
        let account = CpuAccount { dir, version };
        fs::write(account.dir.join("cgroup.procs"), pid.to_string()).ok()?;
        account.usage_ns().ok()?;
        Some(account)
    }

    /// The CPU time of everything in the cgroup since it was made, in nanoseconds.
    pub(crate) fn usage_ns(&self) -> anyhow::Result<u64> {
        let file = match self.version {
            CgroupVersion::V1 => "cpuacct.usage",
            CgroupVersion::V2 => "cpu.stat",
        };
        let path = self.dir.join(file);
        let text = fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        usage_ns(self.version, &text).with_context(|| format!("no CPU usage in {}: {text:?}", path.display()))
    }
}

impl Drop for CpuAccount {
    fn drop(&mut self) {
        // Empty once the process exited; otherwise it stays (and a next run reuses the name).
        let _ = fs::remove_dir(&self.dir);
    }
}

fn usage_ns(version: CgroupVersion, text: &str) -> Option<u64> {
    match version {
        CgroupVersion::V1 => text.trim().parse().ok(),
        CgroupVersion::V2 => text.lines().find_map(|line| {
            let micros: u64 = line.strip_prefix("usage_usec ")?.trim().parse().ok()?;
            micros.checked_mul(1000)
        }),
    }
}

/// The 1, 5 and 15 minute load averages.
pub(crate) fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// CPU count, memory and kernel of this machine.
pub(crate) fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem_gib = fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| status_field(&m, "MemTotal"))
        .map_or(0.0, |kib| kib as f64 / 1024.0 / 1024.0);
    let model = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find_map(|l| {
                l.strip_prefix("model name")?
                    .split_once(':')
                    .map(|(_, m)| m.trim().to_owned())
            })
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cpus} CPUs ({model}), {mem_gib:.0} GiB, Linux {}", kernel.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_stat_and_io_fields() {
        let status = "Name:\tpod-checkpointer\nVmHWM:\t   16400 kB\nVmRSS:\t   16212 kB\nRssAnon:\t    4100 kB\nRssFile:\t   12112 kB\nThreads:\t3\n";
        assert_eq!(status_field(status, "VmRSS"), Some(16212));
        assert_eq!(status_field(status, "VmHWM"), Some(16400));
        assert_eq!(status_field(status, "Threads"), Some(3));
        assert_eq!(status_field(status, "RssAnon"), Some(4100));
        assert_eq!(status_field(status, "RssFile"), Some(12112));
        assert_eq!(status_field(status, "VmSwap"), None);
        let stat = "4242 (pod checkpointer) S 1 4242 4242 0 -1 4194560 900 0 0 0 12 5 0 0 20 0 3 0";
        assert_eq!(cpu_ticks(stat), Some(17));
        assert_eq!(cpu_ticks("garbage"), None);
        let io = "rchar: 10\nwchar: 20\nwrite_bytes: 4096\ncancelled_write_bytes: 0\n";
        assert_eq!(io_field(io, "write_bytes"), Some(4096));
    }

    #[test]
    fn cgroup_usage_reads_in_nanoseconds() {
        let check = |version, text: &str, expected: Option<u64>| {
            assert_eq!(usage_ns(version, text), expected, "{version:?} {text:?}");
        };
        check(CgroupVersion::V1, "123456789\n", Some(123_456_789));
        check(CgroupVersion::V1, "", None);
        check(
            CgroupVersion::V2,
            "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n",
            Some(1_500_000),
        );
        check(CgroupVersion::V2, "user_usec 1000\n", None);
    }
}
