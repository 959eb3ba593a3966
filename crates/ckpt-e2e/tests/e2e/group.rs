//! Scenarios that share one environment (a real node, three of them): started once, run one
//! after the other, then stopped with a check that nothing survives.

use std::panic::{self, AssertUnwindSafe};
use std::time::Instant;

use ckpt_e2e::interrupt;
use ckpt_e2e::progress::{Progress, human_duration};

/// What a group's shared environment does for the runner when a scenario fails.
pub(crate) trait SharedEnv {
    /// Copies the environment's logs into `target/tmp/e2e-logs/<scenario>/`.
    fn keep_logs(&self, scenario: &str);
    /// Prints the tails of the environment's logs.
    fn report_failure(&self);
    /// What the digest at the end of the run repeats after the first failure's error (the
    /// scenarios share the environment: its first failure explains the ones after it).
    fn failure_digest(&self) -> Vec<String> {
        Vec::new()
    }
}

/// A scenario of a group, by name.
pub(crate) type GroupScenario<E> = (&'static str, fn(&mut E) -> anyhow::Result<()>);

/// How a group starts and stops its environment.
pub(crate) struct Group<E> {
    /// What the scenarios run on, for the progress lines: "a real node".
    pub(crate) on: &'static str,
    pub(crate) start: fn(Progress) -> anyhow::Result<E>,
    /// Stops the environment and checks that nothing of it survives.
    pub(crate) stop: fn(E) -> anyhow::Result<()>,
    /// The name under which a stop that leaves something behind fails the run.
    pub(crate) stop_check: &'static str,
}

impl<E: SharedEnv> Group<E> {
    /// Starts the environment, runs `selected` on it one after the other (each leaves it as it
    /// found it), then stops it; returns the names of what failed.
    pub(crate) fn run(&self, selected: &[&GroupScenario<E>]) -> Vec<&'static str> {
        let all = || selected.iter().map(|(name, _)| *name).collect::<Vec<_>>();
        let progress = Progress::timed("e2e");
        eprintln!(
            "\ne2e: {} scenario(s) on {}; starting it with its control plane",
            selected.len(),
            self.on
        );
        let started = Instant::now();
        let mut env = match (self.start)(progress) {
            Ok(env) => env,
            Err(e) => {
                eprintln!("e2e: cannot start {}: {e:#}", self.on);
                crate::remember_failure(&format!("the start of {}: {e:#}", self.on));
                return all();
            }
        };
        progress.say(&format!(
            "{} Ready {} after the start",
            self.on,
            human_duration(started.elapsed())
        ));
        let mut failed = Vec::new();
        for (index, (name, scenario)) in selected.iter().enumerate() {
            if interrupt::requested() {
                failed.extend(selected[index..].iter().map(|(n, _)| *n));
                break;
            }
            eprintln!("\n=== scenario {name} (on {})", self.on);
            let scenario_started = Instant::now();
            let outcome = panic::catch_unwind(AssertUnwindSafe(|| scenario(&mut env)))
                .unwrap_or_else(|_| Err(anyhow::anyhow!("the scenario panicked")));
            if outcome.is_err() || std::env::var_os(crate::suite::KEEP_LOGS_ENV).is_some() {
                env.keep_logs(name);
            }
            match outcome {
                Ok(()) => eprintln!("--- {name}: ok ({})", human_duration(scenario_started.elapsed())),
                Err(e) => {
                    env.report_failure();
                    eprintln!(
                        "--- {name}: FAILED after {}: {e:#}",
                        human_duration(scenario_started.elapsed())
                    );
                    crate::remember_failure(&format!("{name}: {e:#}"));
                    if failed.is_empty() {
                        for line in env.failure_digest() {
                            crate::remember_failure(&line);
                        }
                    }
                    failed.push(*name);
                }
            }
        }
        if let Err(e) = (self.stop)(env) {
            eprintln!("--- {}: FAILED: {e:#}", self.stop_check);
            crate::remember_failure(&format!("{}: {e:#}", self.stop_check));
            failed.push(self.stop_check);
        }
        failed
    }
}
