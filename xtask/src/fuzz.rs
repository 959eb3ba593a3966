//! `cargo xtask fuzz [TARGET…] [--secs N]`: issue 18's coverage-guided fuzzing, the longer
//! part of it (CI runs the bounded property run in `crates/ckpt-core/tests/outside_input.rs`,
//! which checks the same invariants). Installs cargo-fuzz from crates.io when it is
//! missing, then runs each target of `fuzz/` on the nightly toolchain for N seconds,
//! starting from the seeds in `fuzz/seeds/<target>`; what the fuzzer finds interesting is
//! kept in `fuzz/corpus/<target>` for the next run, libFuzzer's output goes to
//! `fuzz/logs/<target>.log`, and a crashing input is left in `fuzz/artifacts/<target>/` and
//! fails the command.

use std::fs;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};
use ckpt_e2e::progress::{Progress, human_duration};

/// The targets of `fuzz/Cargo.toml`, in the order they run.
const TARGETS: [&str; 6] = [
    "sanitize",
    "strings",
    "config",
    "duration",
    "lock_record",
    "stored_manifest",
];

/// Run the fuzz targets (cargo-fuzz, nightly) for a while each.
#[derive(clap::Args)]
pub(crate) struct Fuzz {
    /// Only these targets (default: all).
    #[arg(value_parser = clap::builder::PossibleValuesParser::new(TARGETS))]
    targets: Vec<String>,
    /// How long each target runs.
    #[arg(long, default_value_t = 60)]
    secs: u64,
}

impl Fuzz {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        let say = Progress::new("fuzz");
        let dir = ckpt_e2e::project_root().join("fuzz");
        if !cargo_fuzz_installed() {
            say.say("installing cargo-fuzz from crates.io (a few minutes, once)");
            ckpt_e2e::run("cargo", &["install", "cargo-fuzz", "--locked"])?;
        }
        let targets: Vec<&str> = if self.targets.is_empty() {
            TARGETS.to_vec()
        } else {
            self.targets.iter().map(String::as_str).collect()
        };
        fs::create_dir_all(dir.join("logs"))?;
        for target in targets {
            let corpus = dir.join("corpus").join(target);
            fs::create_dir_all(&corpus)?;
            let log_path = dir.join("logs").join(format!("{target}.log"));
            say.say(&format!(
                "{target}: {} s (libFuzzer's output: {})",
                self.secs,
                log_path.display()
            ));
            let started = Instant::now();
            let log = fs::File::create(&log_path)?;
            let status = Command::new("cargo")
                .args(["+nightly", "fuzz", "run", target])
                .arg(&corpus)
                .arg(dir.join("seeds").join(target))
                .args([
                    "--",
                    &format!("-max_total_time={}", self.secs),
                    "-print_final_stats=1",
                ])
                .current_dir(&dir)
                .stdout(Stdio::null())
                .stderr(log)
                .status()
                .context("cannot run cargo fuzz")?;
            let output = fs::read_to_string(&log_path).unwrap_or_default();
            let done = output
                .lines()
                .find(|l| l.starts_with("Done "))
                .unwrap_or("no run count in the log");
            if !status.success() {
                let tail: Vec<&str> = output.lines().rev().take(30).collect();
                eprintln!("{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
                bail!(
                    "{target} failed ({status}) after {}: the crashing input is in {}",
                    human_duration(started.elapsed()),
                    dir.join("artifacts").join(target).display()
                );
            }
            let kept = fs::read_dir(&corpus).map(Iterator::count).unwrap_or(0);
            say.say(&format!(
                "{target}: no failure; {done}; {kept} inputs in its corpus"
            ));
        }
        Ok(())
    }
}

fn cargo_fuzz_installed() -> bool {
    Command::new("cargo")
        .args(["fuzz", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[cfg(test)]
mod tests {
    /// The targets here are the `[[bin]]`s of `fuzz/Cargo.toml`, no more, no less.
    #[test]
    fn the_targets_are_those_of_the_fuzz_crate() {
        let manifest = std::fs::read_to_string(ckpt_e2e::project_root().join("fuzz/Cargo.toml")).unwrap();
        let bins: Vec<&str> = manifest
            .split("[[bin]]")
            .skip(1)
            .filter_map(|bin| {
                let line = bin.lines().find(|l| l.trim_start().starts_with("name"))?;
                line.split('"').nth(1)
            })
            .collect();
        assert_eq!(bins, super::TARGETS);
    }
}
