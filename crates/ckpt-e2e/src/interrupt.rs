//! Ctrl-C (SIGINT) and SIGTERM for long-running xtask commands: the first one only sets a
//! flag that every wait checks, so the command fails with "interrupted" and the normal
//! clean-up path runs (agents stopped, the control plane's `Drop`, the work dir removed). A
//! second one ends the process at once.
//!
//! The children get the terminal's SIGINT too (same process group) and exit; the clean-up
//! then only reaps them, kills what is left and removes the files.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use signal_hook::consts::{SIGINT, SIGTERM};

use crate::progress::Progress;

static REQUESTED: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// Installs the handlers (once per process; later calls do nothing).
pub fn install() -> anyhow::Result<()> {
    if REQUESTED.get().is_some() {
        return Ok(());
    }
    let flag = Arc::new(AtomicBool::new(false));
    for signal in [SIGINT, SIGTERM] {
        // Registered first, so it sees the flag as it was before this signal: exit(130) on
        // the second signal only.
        signal_hook::flag::register_conditional_shutdown(signal, 130, Arc::clone(&flag))?;
        signal_hook::flag::register(signal, Arc::clone(&flag))?;
    }
    let _ = REQUESTED.set(flag);
    Ok(())
}

/// Whether Ctrl-C (or SIGTERM) was received.
pub fn requested() -> bool {
    REQUESTED.get().is_some_and(|flag| flag.load(Ordering::SeqCst))
}

/// Runs a whole command, `task`, with the handlers installed. `task` owns what it starts, so
/// when Ctrl-C stops it everything is cleaned up by the time it returns; then `progress` says
/// `interrupted: <cleaned_up>` and the process exits with 130, as an interrupted command does.
pub fn run(
    progress: Progress,
    cleaned_up: &str,
    task: impl FnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    install()?;
    let outcome = task();
    if requested() {
        progress.say(&format!("interrupted: {cleaned_up}"));
        std::process::exit(130);
    }
    outcome
}

/// Fails with "interrupted" once Ctrl-C was received.
pub fn check() -> anyhow::Result<()> {
    anyhow::ensure!(!requested(), "interrupted (Ctrl-C)");
    Ok(())
}
