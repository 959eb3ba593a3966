//! The standard `process_*` metrics (the names every Prometheus client library exports, so
//! the usual dashboards and alerts work): resident and virtual memory, CPU time, open and
//! maximum file descriptors, start time. Read from `/proc/self` on each scrape only, so an
//! agent nobody scrapes pays nothing for them.

use std::fs;

/// One reading of the process's counters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct ProcessSample {
    pub(super) resident_bytes: u64,
    pub(super) virtual_bytes: u64,
    pub(super) cpu_seconds: f64,
    pub(super) start_time_seconds: f64,
    pub(super) open_fds: Option<u64>,
    pub(super) max_fds: Option<u64>,
}

/// The kernel's units for `/proc/self/stat`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Units {
    pub(super) clock_ticks_per_second: u64,
    pub(super) page_size: u64,
}

/// Reads the sample; `None` when `/proc` cannot be read (then the metrics are left out
/// rather than reported as zero).
pub(super) fn sample() -> Option<ProcessSample> {
    let stat = fs::read_to_string("/proc/self/stat").ok()?;
    let boot_time = boot_time(&fs::read_to_string("/proc/stat").ok()?)?;
    let units = Units {
        clock_ticks_per_second: rustix::param::clock_ticks_per_second(),
        page_size: rustix::param::page_size() as u64,
    };
    let mut sample = parse_stat(&stat, boot_time, units)?;
    sample.open_fds = fs::read_dir("/proc/self/fd").ok().map(|d| d.count() as u64);
    sample.max_fds = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    Some(sample)
}

/// `btime` of `/proc/stat`: the boot time in seconds since the epoch.
pub(super) fn boot_time(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// `/proc/self/stat` (proc(5)): the command name is in parentheses and may hold spaces and
/// parentheses itself, so the fields are counted from the last `)`.
pub(super) fn parse_stat(stat: &str, boot_time: u64, units: Units) -> Option<ProcessSample> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After the name: field 3 (state) is index 0, so field N is index N - 3.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    let ticks = units.clock_ticks_per_second.max(1) as f64;
    let (utime, stime, start) = (field(14)?, field(15)?, field(22)?);
    Some(ProcessSample {
        resident_bytes: field(24)?.saturating_mul(units.page_size),
        virtual_bytes: field(23)?,
        cpu_seconds: (utime + stime) as f64 / ticks,
        start_time_seconds: boot_time as f64 + start as f64 / ticks,
        open_fds: None,
        max_fds: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNITS: Units = Units {
        clock_ticks_per_second: 100,
        page_size: 4096,
    };

    fn check(stat: &str, expected: Option<(u64, u64, f64, f64)>) {
        let got = parse_stat(stat, 1_700_000_000, UNITS).map(|s| {
            (
                s.resident_bytes,
                s.virtual_bytes,
                s.cpu_seconds,
                s.start_time_seconds,
            )
        });
        assert_eq!(got, expected, "{stat:?}");
    }

    #[test]
    fn stat_lines() {
        // Fields 14/15 utime/stime 150+50 ticks, 22 starttime 12345 ticks, 23 vsize, 24 rss pages.
        let tail =
            "S 1 1 1 0 -1 4194560 100 0 0 0 150 50 0 0 20 0 4 0 12345 52428800 3000 18446744073709551615";
        check(
            &format!("4242 (pod-checkpointer) {tail}"),
            Some((3000 * 4096, 52_428_800, 2.0, 1_700_000_123.45)),
        );
        // A name with spaces and parentheses does not shift the fields.
        check(
            &format!("4242 (a (b) c) {tail}"),
            Some((3000 * 4096, 52_428_800, 2.0, 1_700_000_123.45)),
        );
        check("4242 (truncated) S 1 1", None);
        check("no parenthesis at all", None);
        check("", None);
    }

    #[test]
    fn boot_time_from_proc_stat() {
        assert_eq!(
            boot_time("cpu  1 2 3\nbtime 1700000000\nprocesses 9\n"),
            Some(1_700_000_000)
        );
        assert_eq!(boot_time("cpu  1 2 3\n"), None);
        assert_eq!(boot_time("btime soon\n"), None);
    }

    #[test]
    fn this_process_is_sampled() {
        let s = sample().expect("/proc is readable in tests");
        assert!(
            s.resident_bytes > 0 && s.virtual_bytes >= s.resident_bytes,
            "{s:?}"
        );
        assert!(s.open_fds.is_some_and(|n| n >= 3), "{s:?}");
        assert!(s.start_time_seconds > 1_600_000_000.0, "{s:?}");
    }
}
