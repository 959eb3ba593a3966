//! Bounded polling: every wait of xtask (the control plane becoming ready, the suite's and the
//! demo's expectations, the bench's set-up) waits at most a timeout and, when it gives up,
//! says what it expected and what it saw last.

use std::fmt;
use std::path::Path;
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};

use crate::interrupt;
use crate::process::log_tail_section;
use crate::progress::human_duration;

/// How long an expectation is polled before it fails: generous, since the suite asserts
/// outcomes, not latencies (those are measured by the benchmarks).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

const INTERVAL: Duration = Duration::from_millis(100);

/// One look at the world: the expected value, or a description of what was seen instead.
pub enum Probe<T> {
    Ready(T),
    Waiting(String),
}

/// The error of a [`wait_for`] that gave up (not of a failed probe), so a caller can add
/// what explains it, such as the tail of a log.
#[derive(Debug)]
pub struct TimedOut {
    message: String,
}

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for TimedOut {}

/// Polls `probe` until it is [`Probe::Ready`]; returns its value and the time it took. A probe
/// error aborts at once (turn transient errors into [`Probe::Waiting`] with
/// [`waiting_on_error`]); Ctrl-C aborts too. Giving up is a [`TimedOut`] error.
pub fn wait_for<T>(
    expected: &str,
    timeout: Duration,
    mut probe: impl FnMut() -> anyhow::Result<Probe<T>>,
) -> anyhow::Result<(T, Duration)> {
    let started = Instant::now();
    loop {
        interrupt::check()?;
        let seen = match probe()? {
            Probe::Ready(value) => return Ok((value, started.elapsed())),
            Probe::Waiting(seen) => seen,
        };
        if started.elapsed() >= timeout {
            return Err(TimedOut {
                message: format!(
                    "timed out after {} waiting for {expected}; last seen: {seen}",
                    human_duration(timeout)
                ),
            }
            .into());
        }
        sleep(INTERVAL);
    }
}

/// Checks that `probe` stays [`Probe::Ready`] for `duration` (a state that must hold, such as
/// "no activation while the API server answers"); fails with what was seen when it changes.
pub fn holds_for(
    expected: &str,
    duration: Duration,
    mut probe: impl FnMut() -> anyhow::Result<Probe<()>>,
) -> anyhow::Result<()> {
    let started = Instant::now();
    while started.elapsed() < duration {
        interrupt::check()?;
        if let Probe::Waiting(seen) = probe()? {
            bail!(
                "expected {expected} for {}, but after {}: {seen}",
                human_duration(duration),
                human_duration(started.elapsed())
            );
        }
        sleep(INTERVAL);
    }
    Ok(())
}

/// Maps an error to [`Probe::Waiting`], for probes whose failures are expected to pass (a
/// kubectl call while the API server restarts).
pub fn waiting_on_error<T>(result: anyhow::Result<Probe<T>>) -> anyhow::Result<Probe<T>> {
    Ok(result.unwrap_or_else(|e| Probe::Waiting(format!("error: {e:#}"))))
}

/// [`wait_for`] a process to become ready; giving up adds the tail of its `log`.
pub fn wait_ready<T>(
    what: &str,
    timeout: Duration,
    log: &Path,
    probe: impl FnMut() -> anyhow::Result<Probe<T>>,
) -> anyhow::Result<(T, Duration)> {
    wait_for(what, timeout, probe).map_err(|e| match e.downcast::<TimedOut>() {
        Ok(timed_out) => anyhow!("{timed_out}\n{}", log_tail_section(log, 30)),
        Err(e) => e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_until_ready_and_reports_the_value() {
        let mut calls = 0;
        let (value, _) = wait_for("the third call", Duration::from_secs(5), || {
            calls += 1;
            Ok(if calls == 3 {
                Probe::Ready(calls)
            } else {
                Probe::Waiting(format!("call {calls}"))
            })
        })
        .unwrap();
        assert_eq!(value, 3);
    }

    #[test]
    fn a_timeout_names_the_expectation_and_the_last_sight() {
        let error = wait_for::<()>("a miracle", Duration::from_millis(250), || {
            Ok(Probe::Waiting("nothing".into()))
        })
        .unwrap_err();
        assert!(error.is::<TimedOut>(), "{error}");
        let error = error.to_string();
        assert!(error.contains("waiting for a miracle"), "{error}");
        assert!(error.contains("last seen: nothing"), "{error}");
    }

    #[test]
    fn a_probe_error_aborts_unless_mapped_to_waiting() {
        let error = wait_for::<()>("x", Duration::from_secs(5), || anyhow::bail!("boom")).unwrap_err();
        assert!(!error.is::<TimedOut>(), "{error}");
        let mut calls = 0;
        let result = wait_for("y", Duration::from_secs(5), || {
            calls += 1;
            waiting_on_error(if calls < 2 {
                Err(anyhow::anyhow!("transient"))
            } else {
                Ok(Probe::Ready(()))
            })
        });
        assert!(result.is_ok());
    }

    #[test]
    fn holds_for_fails_when_the_state_changes() {
        let mut calls = 0;
        let error = holds_for("calm", Duration::from_secs(5), || {
            calls += 1;
            Ok(if calls < 3 {
                Probe::Ready(())
            } else {
                Probe::Waiting("storm".into())
            })
        })
        .unwrap_err()
        .to_string();
        assert!(error.contains("expected calm"), "{error}");
        assert!(error.contains("storm"), "{error}");
    }
}
