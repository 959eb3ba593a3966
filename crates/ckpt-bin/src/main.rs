//! `pod-checkpointer`: the node agent that keeps a self-hosted Kubernetes control plane
//! bootable (see the workspace README and DESIGN §3.7 for the command-line contract).
//!
//! Exit codes: 0 success (also after self-GC and SIGTERM), 2 usage or configuration
//! error (the message names the flag), 1 runtime failure.

mod agent;
mod config;
mod drain;
mod duration;
mod error;
mod events;
mod executor;
mod health;
mod inspect;

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use crate::config::{Cli, Command, DiskSettings, Environment, LogFormat, RunSettings, read_file_config};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match dispatch(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let text = format!("{:#}", anyhow::Error::from(e.error));
            eprintln!("pod-checkpointer: {text}");
            ExitCode::from(e.code)
        }
    }
}

/// An error on its way out, with the exit code it maps to.
struct Failure {
    error: error::Error,
    code: u8,
}

impl From<error::Error> for Failure {
    fn from(error: error::Error) -> Self {
        let code = error.exit_code();
        Self { error, code }
    }
}

fn dispatch(cli: Cli) -> Result<(), Failure> {
    match cli.command {
        Command::Strategies => {
            let strategies = ckpt_gc::strategies();
            let width = strategies.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
            let mut out = String::new();
            for (name, summary) in strategies {
                out.push_str(&format!("{name:<width$}  {summary}\n"));
            }
            print(&out);
            Ok(())
        }
        Command::Inspect(args) => {
            init_logging(LogFormat::Text, "warn");
            let file = read_file_config(args.disk.config.as_deref())?;
            let disk = DiskSettings::resolve(&args.disk, &file);
            let report = inspect::report(&disk, ckpt_core::Timestamp::now())?;
            print(&inspect::render(&report, args.output));
            Ok(())
        }
        Command::Drain(args) => {
            init_logging(LogFormat::Text, "warn");
            let file = read_file_config(args.disk.config.as_deref())?;
            let disk = DiskSettings::resolve(&args.disk, &file);
            let removed = drain::drain(&disk, args.force)?;
            let mut out = String::new();
            if removed.is_empty() {
                out.push_str("nothing to remove\n");
            }
            for line in removed {
                out.push_str(&format!("removed {line}\n"));
            }
            print(&out);
            Ok(())
        }
        Command::Run(args) => {
            let file = read_file_config(args.disk.config.as_deref())?;
            let settings = RunSettings::resolve(*args, file, &Environment::from_process())?;
            init_logging(settings.log_format, "info");
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .map_err(|e| error::Error::runtime("cannot start the async runtime", e))?;
            runtime.block_on(agent::run(settings))?;
            Ok(())
        }
    }
}

/// Writes command output to stdout (the one place the binary prints results).
#[allow(clippy::print_stdout)]
fn print(text: &str) {
    print!("{text}");
}

/// Logs go to stderr, levels from RUST_LOG (else `default_level`), text or JSON lines.
fn init_logging(format: LogFormat, default_level: &str) {
    // kube's client logs every failed connection at ERROR; the observers already report
    // a failing source once per change, so that line would repeat every second.
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("{default_level},kube_client::client::builder=off")));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}
