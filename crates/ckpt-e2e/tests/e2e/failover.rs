//! A client of the three nodes' API servers that fails over, as a client given the three
//! addresses would: it rewrites one ConfigMap again and again, each write through the first
//! address that takes it, and records every attempt. Its failures through every address are
//! what a user of the cluster would have seen.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::Context;
use ckpt_e2e::harness::kubectl::Kubectl;
use ckpt_e2e::progress::human_duration;
use ckpt_e2e::self_hosted::SelfHosted;

/// The failover client's request timeout: a server that takes the connection and answers
/// nothing (waiting for a quorum) costs it this much before it tries the next address.
const REQUEST_TIMEOUT: &str = "2s";
/// The longest a write may keep failing through every address: the client's move to the
/// next address (at most one request timeout per address that hangs, two of them) and an
/// etcd election when the cut member led (its election timeout, 2.5 s, twice for a split
/// vote): 2 × 2 s + 2 × 2.5 s, rounded up.
pub(crate) const FAILOVER_BOUND: Duration = Duration::from_secs(10);
/// The ConfigMap the failover client rewrites, and its namespace.
const PROBE: &str = "failover-probe";
const NAMESPACE: &str = "default";
/// The pause between two writes.
const EVERY: Duration = Duration::from_millis(200);

/// One write: when it started and ended, and whether an address took it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Attempt {
    pub(crate) started: Instant,
    pub(crate) finished: Instant,
    pub(crate) ok: bool,
}

/// A client writing one ConfigMap again and again, each write through the first of the three
/// node addresses that takes it. Dropped without [`stop`](FailoverWriter::stop) (a scenario
/// that failed), it stops writing all the same.
pub(crate) struct FailoverWriter {
    kubectl: Kubectl,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Vec<Attempt>>>,
}

impl Drop for FailoverWriter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// What the failover client saw.
pub(crate) struct Writes {
    attempts: Vec<Attempt>,
    /// From the start of the first write that failed after a success to the end of the next
    /// success.
    longest_failure: Duration,
}

impl Writes {
    pub(crate) fn summary(&self) -> String {
        format!(
            "{} writes, {} failed through every address, the longest failing stretch {}",
            self.attempts.len(),
            self.attempts.iter().filter(|a| !a.ok).count(),
            human_duration(self.longest_failure)
        )
    }

    /// Fails when a write kept failing through every address for longer than
    /// [`FAILOVER_BOUND`] `during` what the scenario did.
    pub(crate) fn ensure_within_bound(&self, during: &str) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.longest_failure <= FAILOVER_BOUND,
            "a write kept failing for {} through every address {during} (the bound: {})",
            human_duration(self.longest_failure),
            human_duration(FAILOVER_BOUND)
        );
        Ok(())
    }

    /// How long after `since` the first write that started after it succeeded.
    pub(crate) fn first_success_after(&self, since: Instant) -> Option<Duration> {
        self.attempts
            .iter()
            .find(|a| a.ok && a.started >= since)
            .map(|a| a.finished.duration_since(since))
    }

    /// The longest stretch of writes that failed through every address, from the start of
    /// the first of them to the end of the success after them (or of the last attempt).
    fn longest_failure(attempts: &[Attempt]) -> Duration {
        let mut longest = Duration::ZERO;
        let mut failing_since: Option<Instant> = None;
        for attempt in attempts {
            match (attempt.ok, failing_since) {
                (false, None) => failing_since = Some(attempt.started),
                (true, Some(since)) => {
                    longest = longest.max(attempt.finished.duration_since(since));
                    failing_since = None;
                }
                _ => {}
            }
        }
        if let (Some(since), Some(last)) = (failing_since, attempts.last()) {
            longest = longest.max(last.finished.duration_since(since));
        }
        longest
    }
}

impl FailoverWriter {
    /// Creates the ConfigMap and starts writing it through `self_hosted`'s API servers.
    pub(crate) fn start(kubectl: &Kubectl, self_hosted: &SelfHosted) -> anyhow::Result<FailoverWriter> {
        let urls: Vec<String> = self_hosted.apis().map(str::to_owned).collect();
        let kubectl = kubectl.clone();
        // One a failed scenario left (its writer dropped, not stopped) is written over.
        delete_probe(&kubectl)?;
        kubectl.run(
            &[
                "create",
                "configmap",
                "-n",
                NAMESPACE,
                PROBE,
                "--from-literal=seq=0",
            ],
            None,
        )?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let writer = kubectl.clone();
        let handle = thread::spawn(move || {
            let timeout = format!("--request-timeout={REQUEST_TIMEOUT}");
            let mut attempts = Vec::new();
            let mut seq = 0u64;
            while !stopping.load(Ordering::Relaxed) {
                seq += 1;
                let patch = format!(r#"{{"data":{{"seq":"{seq}"}}}}"#);
                let started = Instant::now();
                let ok = urls.iter().any(|url| {
                    let args = [
                        "--server",
                        url.as_str(),
                        timeout.as_str(),
                        "patch",
                        "configmap",
                        "-n",
                        NAMESPACE,
                        PROBE,
                        "--type=merge",
                        "-p",
                        &patch,
                    ];
                    writer.run(&args, None).is_ok()
                });
                attempts.push(Attempt {
                    started,
                    finished: Instant::now(),
                    ok,
                });
                thread::sleep(EVERY);
            }
            attempts
        });
        Ok(FailoverWriter {
            kubectl,
            stop,
            handle: Some(handle),
        })
    }

    /// Stops writing, deletes the ConfigMap, and says what the writes saw.
    pub(crate) fn stop(mut self) -> anyhow::Result<Writes> {
        self.stop.store(true, Ordering::Relaxed);
        let attempts = self
            .handle
            .take()
            .context("the failover client was stopped before")?
            .join()
            .map_err(|_| anyhow::anyhow!("the failover client panicked"))?;
        // Leaves the cluster as it found it: the next scenario writes its own.
        delete_probe(&self.kubectl)?;
        Ok(Writes {
            longest_failure: Writes::longest_failure(&attempts),
            attempts,
        })
    }
}

/// Deletes the ConfigMap the client writes, if it exists.
fn delete_probe(kubectl: &Kubectl) -> anyhow::Result<()> {
    kubectl
        .run(
            &[
                "delete",
                "configmap",
                "-n",
                NAMESPACE,
                PROBE,
                "--ignore-not-found",
            ],
            None,
        )
        .map(drop)
}
