//! Who holds the agent's lock on the real node, seen from the host without taking part in
//! it: `/proc/locks` says whether a process holds the `flock` on the lock file (in the
//! host's pid namespace), and the holder record in the file says which pod that process
//! is. Nothing here opens the lock file for locking, so the copies never see the watch.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::progress::human_duration;
use anyhow::Context;
use ckpt_core::LockIdentity;

/// How often the watch looks: well under the copies' 250 ms poll, so a handover's gap is
/// seen to within a look.
const LOOK_INTERVAL: Duration = Duration::from_millis(20);

/// The process holding the lock and the pod it says it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    /// In the host's pid namespace.
    pub pid: u32,
    /// `None` while the record in the file is not (yet) a pod's: a new holder writes its
    /// record just after it took the lock.
    pub pod: Option<String>,
}

/// The current holder of the `flock` on `lock_file`, if any.
pub fn lock_holder(lock_file: &Path) -> anyhow::Result<Option<Holding>> {
    let metadata = match fs::metadata(lock_file) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("stat {}", lock_file.display())),
    };
    let locks = fs::read_to_string("/proc/locks").context("reading /proc/locks")?;
    let Some(pid) = flock_holder_pid(&locks, metadata.dev(), metadata.ino()) else {
        return Ok(None);
    };
    let pod = ckpt_lock::read_holder(lock_file)
        .ok()
        .flatten()
        .and_then(|record| LockIdentity::parse(&record.identity))
        .map(|identity| identity.pod_name);
    Ok(Some(Holding { pid, pod }))
}

/// The pid of the granted `FLOCK` on the file `(dev, ino)` in `/proc/locks` text, e.g.
/// `3: FLOCK  ADVISORY  WRITE 4242 00:2e:1234 0 EOF` (device as hex `major:minor`); the
/// blocked waiters' lines (`3: -> FLOCK …`) are not holders.
fn flock_holder_pid(locks: &str, dev: u64, ino: u64) -> Option<u32> {
    // The kernel's split of a `dev_t` (glibc's `major`/`minor`).
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let file = format!("{major:02x}:{minor:02x}:{ino}");
    locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            [_, "FLOCK", _, _, pid, id, ..] if *id == file => pid.parse().ok(),
            _ => None,
        }
    })
}

/// One stretch of the watch with the same holder (or none).
#[derive(Debug, Clone)]
pub struct Stretch {
    pub holder: Option<Holding>,
    pub from: Duration,
    pub to: Duration,
}

/// Who held the lock while the watch ran, as stretches in order.
#[derive(Debug, Clone)]
pub struct LockTimeline {
    pub stretches: Vec<Stretch>,
}

impl LockTimeline {
    /// The pods that held the lock, in order, one entry per holding process (a holder whose
    /// record never named a pod shows as `?`).
    pub fn holders(&self) -> Vec<String> {
        self.stretches
            .iter()
            .filter_map(|s| s.holder.as_ref())
            .map(|h| h.pod.clone().unwrap_or_else(|| "?".into()))
            .collect()
    }

    /// The longest time nobody held the lock.
    pub fn longest_gap(&self) -> Duration {
        self.stretches
            .iter()
            .filter(|s| s.holder.is_none())
            .map(|s| s.to.saturating_sub(s.from))
            .max()
            .unwrap_or_default()
    }

    /// `pod-a (pid 10) 0 s–12.3 s, nobody 12.3 s–12.5 s, …`, for failure messages.
    pub fn describe(&self) -> String {
        self.stretches
            .iter()
            .map(|s| {
                let who = match &s.holder {
                    Some(h) => format!("{} (pid {})", h.pod.as_deref().unwrap_or("?"), h.pid),
                    None => "nobody".into(),
                };
                format!("{who} {}–{}", human_duration(s.from), human_duration(s.to))
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Records, from a thread, who holds the lock every [`LOOK_INTERVAL`].
pub struct LockWatch {
    stop: Arc<AtomicBool>,
    handle: thread::JoinHandle<anyhow::Result<LockTimeline>>,
}

impl LockWatch {
    pub fn start(lock_file: PathBuf) -> LockWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let handle = thread::spawn(move || {
            let started = Instant::now();
            let mut stretches: Vec<Stretch> = Vec::new();
            loop {
                let at = started.elapsed();
                let holder = lock_holder(&lock_file)?;
                match stretches.last_mut() {
                    Some(last) if same_process(&last.holder, &holder) => {
                        last.to = at;
                        // The record can lag the flock by a look; keep the latest name.
                        if let (Some(last), Some(now)) = (&mut last.holder, holder)
                            && now.pod.is_some()
                        {
                            last.pod = now.pod;
                        }
                    }
                    last => {
                        if let Some(last) = last {
                            last.to = at;
                        }
                        stretches.push(Stretch {
                            holder,
                            from: at,
                            to: at,
                        });
                    }
                }
                if stopping.load(Ordering::SeqCst) {
                    return Ok(LockTimeline { stretches });
                }
                thread::sleep(LOOK_INTERVAL);
            }
        });
        LockWatch { stop, handle }
    }

    pub fn stop(self) -> anyhow::Result<LockTimeline> {
        self.stop.store(true, Ordering::SeqCst);
        match self.handle.join() {
            Ok(timeline) => timeline,
            Err(_) => anyhow::bail!("the lock watch panicked"),
        }
    }
}

fn same_process(a: &Option<Holding>, b: &Option<Holding>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a.pid == b.pid,
        (None, None) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(locks: &str, dev: u64, ino: u64, expected: Option<u32>) {
        assert_eq!(flock_holder_pid(locks, dev, ino), expected, "{locks}");
    }

    #[test]
    fn the_holder_is_read_from_proc_locks() {
        // dev 0x2e = 00:2e; dev (8 << 8) | 1 = 08:01.
        let locks = "1: POSIX  ADVISORY  WRITE 7 00:2e:99 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 4242 00:2e:1234 0 EOF\n\
                     2: -> FLOCK  ADVISORY  WRITE 4343 00:2e:1234 0 EOF\n\
                     3: FLOCK  ADVISORY  WRITE 55 08:01:1234 0 EOF\n";
        check(locks, 0x2e, 1234, Some(4242));
        check(locks, (8 << 8) | 1, 1234, Some(55));
        check(locks, 0x2e, 99, None);
        check(locks, 0x2e, 5, None);
        check("", 0x2e, 1234, None);
    }
}
