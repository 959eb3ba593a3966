//! Latency from observable events: a watcher thread polls a condition (a file appearing or
//! vanishing, a pod running in the CRI) every [`POLL`] and records when it first held. It is
//! started before the action, so an event that happens while the action's call is still
//! returning is not missed; the latency is that instant minus the mark taken just before the
//! action.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use crate::interrupt;
use crate::progress::human_duration;
use anyhow::bail;

/// How often a watcher looks: the resolution of every latency measured.
pub(crate) const POLL: Duration = Duration::from_millis(5);

/// A condition being polled on its own thread.
pub(crate) struct Watcher {
    what: String,
    seen: mpsc::Receiver<Instant>,
    stop: Arc<AtomicBool>,
}

/// Starts polling `holds` every [`POLL`] (errors count as "not yet").
pub(crate) fn watch(what: &str, holds: impl FnMut() -> bool + Send + 'static) -> Watcher {
    watch_every(what, POLL, holds)
}

/// [`watch`] with another interval, for conditions that are costly to look at.
pub(crate) fn watch_every(
    what: &str,
    interval: Duration,
    mut holds: impl FnMut() -> bool + Send + 'static,
) -> Watcher {
    let (tx, seen) = mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = Arc::clone(&stop);
    thread::spawn(move || {
        while !stopped.load(Ordering::SeqCst) {
            if holds() {
                let _ = tx.send(Instant::now());
                return;
            }
            thread::sleep(interval);
        }
    });
    Watcher {
        what: what.to_owned(),
        seen,
        stop,
    }
}

impl Watcher {
    /// Waits for the condition; returns when it first held, measured from `since` (the mark
    /// taken just before the action). Fails on timeout, Ctrl-C, or when it held before `since`.
    pub(crate) fn wait_since(self, since: Instant, timeout: Duration) -> anyhow::Result<Duration> {
        self.wait_with_progress(since, timeout, || None)
    }

    /// [`wait_since`](Watcher::wait_since), printing `progress()` every 5 s while it waits.
    pub(crate) fn wait_with_progress(
        self,
        since: Instant,
        timeout: Duration,
        progress: impl Fn() -> Option<String>,
    ) -> anyhow::Result<Duration> {
        let mut last_progress = Instant::now();
        loop {
            interrupt::check()?;
            match self.seen.recv_timeout(Duration::from_millis(50)) {
                Ok(at) => {
                    let Some(latency) = at.checked_duration_since(since) else {
                        bail!("{} already held before the action", self.what);
                    };
                    return Ok(latency);
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => bail!("the watcher for {} stopped", self.what),
            }
            if since.elapsed() > timeout {
                bail!(
                    "timed out after {} waiting for {}",
                    human_duration(timeout),
                    self.what
                );
            }
            if last_progress.elapsed() >= Duration::from_secs(5) {
                last_progress = Instant::now();
                if let Some(line) = progress() {
                    eprintln!("        … {line} ({} so far)", human_duration(since.elapsed()));
                }
            }
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latency_runs_from_the_mark_to_the_first_sight() {
        let flag = Arc::new(AtomicBool::new(false));
        let seen = Arc::clone(&flag);
        let watcher = watch("the flag", move || seen.load(Ordering::SeqCst));
        let mark = Instant::now();
        thread::sleep(Duration::from_millis(30));
        flag.store(true, Ordering::SeqCst);
        let latency = watcher.wait_since(mark, Duration::from_secs(5)).unwrap();
        assert!(latency >= Duration::from_millis(30), "{latency:?}");
        assert!(latency < Duration::from_secs(1), "{latency:?}");
    }

    #[test]
    fn a_condition_that_held_before_the_mark_is_an_error() {
        let watcher = watch("truth", || true);
        thread::sleep(Duration::from_millis(30));
        let error = watcher
            .wait_since(Instant::now(), Duration::from_secs(5))
            .unwrap_err();
        assert!(error.to_string().contains("already held"), "{error}");
    }
}
