//! `pod-checkpointer`: the node agent that keeps a self-hosted Kubernetes control plane
//! bootable (see the workspace README and ARCHITECTURE.md, Command-line contract for the command-line contract).
//!
//! Exit codes: 0 success (also after self-GC and SIGTERM), 2 usage or configuration
//! error (the message names the flag), 1 runtime failure.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = ckpt_bin::config::Cli::parse();
    match ckpt_bin::run_cli(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let code = e.exit_code();
            eprintln!("pod-checkpointer: {}", ckpt_core::error_chain(&e));
            ExitCode::from(code)
        }
    }
}
