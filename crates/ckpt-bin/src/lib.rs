//! `ckpt-bin`: the `pod-checkpointer` node agent as a library, so the binary's `main` stays
//! thin and tools (xtask's `render` and `deploy`, tests) use the very same configuration
//! parser.
//!
//! - [`main`]: the whole program (a custom agent binary with extra strategies calls it);
//!   [`run_cli`] executes a parsed [`config::Cli`] (`run`, `inspect`, `drain`,
//!   `strategies`, `check-config`, `health`, `render`).
//! - [`config::check_config_file`]: whether a YAML config file is accepted by `run`;
//!   [`duration::parse_duration`]: durations as the flags take them (both fuzzed).
//! - [`render`]: the install manifests of `ckpt-render` (`pod-checkpointer render`),
//!   checked against this program's agent ([`render::BuiltIn`]).
//! - [`Error`]: usage errors (exit code 2) and runtime failures (exit code 1).
//! - The original's command line (bootkube's `/checkpoint --lock-file=… --kubeconfig=…`,
//!   no subcommand) runs as `run`, each mapping logged (`original_cli`).
//!
//! ```
//! // A config file as the deploy manifests ship it:
//! ckpt_bin::config::check_config_file("gc-strategy: owner-reference\ncheckpoint-grace-period: 5m\n")?;
//! # Ok::<(), ckpt_bin::Error>(())
//! ```

mod agent;
mod blocking_pool;
pub mod config;
mod credentials;
mod drain;
pub mod duration;
mod error;
mod events;
mod executor;
mod health;
mod inspect;
mod kubeconfig;
mod original_cli;
pub mod render;

pub use error::{Error, Result};

use tracing_subscriber::EnvFilter;

use crate::render::BuiltInOptions as _;

use crate::config::{
    Cli, Command, DiskSettings, Environment, LogFormat, RunArgs, RunSettings, read_file_config,
};

/// The `pod-checkpointer` program: parses the command line, runs it, and maps the outcome
/// to the exit code. A custom agent binary (one that links extra strategy crates) is
/// `fn main() -> ExitCode { ckpt_bin::main() }` plus a `use my_strategy as _;`.
pub fn main() -> std::process::ExitCode {
    use clap::Parser as _;
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // The original's command line (bootkube's `/checkpoint --lock-file=…`) runs as `run`.
    let cli = if original_cli::is_original(&args) {
        match original_cli::translate(&args) {
            Ok(translated) => {
                let mut cli = Cli::parse_from(translated.args);
                cli.original_notes = translated.notes;
                cli
            }
            Err(e) => {
                eprintln!("pod-checkpointer: {}", ckpt_core::error_chain(&e));
                return std::process::ExitCode::from(e.exit_code());
            }
        }
    } else {
        Cli::parse_from(args)
    };
    match run_cli(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let code = e.exit_code();
            eprintln!("pod-checkpointer: {}", ckpt_core::error_chain(&e));
            std::process::ExitCode::from(code)
        }
    }
}

/// Runs a parsed command line.
pub fn run_cli(cli: Cli) -> Result<()> {
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
        Command::CheckConfig(args) => {
            let text = if args.file.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin())
                    .map_err(|e| Error::usage("check-config: cannot read stdin", e))?
            } else {
                std::fs::read_to_string(&args.file).map_err(|e| {
                    Error::usage(format!("check-config: cannot read {}", args.file.display()), e)
                })?
            };
            if let Some(warning) = config::check_config_file(&text)? {
                warn_user(&warning);
            }
            Ok(())
        }
        Command::Inspect(args) => {
            init_logging(
                LogFormat::Text,
                &std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            );
            let file = read_file_config(args.disk.config.as_deref())?;
            let disk = DiskSettings::resolve(&args.disk, &file);
            let revisions = file.revision_settings();
            let report = inspect::report(&disk, &revisions, ckpt_core::Timestamp::now())?;
            print(&inspect::render(&report, args.output));
            Ok(())
        }
        Command::Drain(args) => {
            init_logging(
                LogFormat::Text,
                &std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            );
            let file = read_file_config(args.disk.config.as_deref())?;
            let disk = DiskSettings::resolve(&args.disk, &file);
            let (lines, verb) = if args.dry_run {
                (drain::dry_run(&disk)?, "would remove")
            } else {
                (drain::drain(&disk, args.force)?, "removed")
            };
            let mut out = String::new();
            if lines.is_empty() {
                out.push_str("nothing to remove\n");
            }
            for line in lines {
                out.push_str(&format!("{verb} {line}\n"));
            }
            print(&out);
            Ok(())
        }
        Command::Health(args) => {
            let file = read_file_config(args.config.as_deref())?;
            let socket = health::probe_socket(args.health_socket, file.health_socket())?;
            let kind = if args.live {
                health::ProbeKind::Live
            } else {
                health::ProbeKind::Ready
            };
            let body = health::probe(&socket, kind)?;
            print(&format!("{}\n", body.trim_end()));
            Ok(())
        }
        Command::Render(args) => {
            let options = args.manifest.options(ckpt_render::KubernetesVersion::NEWEST)?;
            let yaml = ckpt_render::to_yaml(&ckpt_render::render(&options))?;
            if args.output == "-" {
                print(&yaml);
                return Ok(());
            }
            std::fs::write(&args.output, yaml)
                .map_err(|e| Error::usage(format!("--output: cannot write {}", args.output), e))
        }
        Command::Run(args) => {
            let settings = run_settings(*args)?;
            init_logging(settings.log_format, &settings.log_level);
            for note in &cli.original_notes {
                tracing::info!("{note}");
            }
            if let Some(warning) = &settings.config_warning {
                tracing::warn!("{warning}");
            }
            // One thread: the agent mostly waits, and the idle cost of a second worker
            // (≈0.7 MiB RSS, most of the idle CPU in wake-ups between workers) buys nothing.
            // The executor yields between file actions so health and probes keep answering.
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                // Disk work runs on the blocking pool (`blocking_pool`): its thread is
                // kept across the 30 s resyncs rather than started again for each pass.
                .thread_keep_alive(std::time::Duration::from_secs(90))
                .build()
                .map_err(|e| Error::runtime("cannot start the async runtime", e))?;
            runtime.block_on(agent::run(
                settings,
                ApiSource::Kubeconfig,
                agent::shutdown_signal(),
            ))?;
            Ok(())
        }
    }
}

#[doc(hidden)]
pub use agent::ApiSource;

/// The agent of `pod-checkpointer run`, in-process: what the integration tests drive
/// (`tests/agent_inprocess.rs`). `cli` must be a `run` command line; `api` says where
/// the API client comes from; `shutdown` stands in for SIGTERM. Logging is the caller's.
/// Everything else is exactly the binary's `run`. Not a stable API.
#[doc(hidden)]
pub async fn run_agent(cli: Cli, api: ApiSource, shutdown: impl Future<Output = ()>) -> Result<()> {
    let Command::Run(args) = cli.command else {
        return Err(Error::usage_message("run_agent needs a `run` command line"));
    };
    agent::run(run_settings(*args)?, api, shutdown).await
}

/// `run`'s flags over the environment over `--config` over the defaults.
fn run_settings(args: RunArgs) -> Result<RunSettings> {
    let file = read_file_config(args.disk.config.as_deref())?;
    RunSettings::resolve(args, file, &Environment::from_process())
}

/// A warning about the command line or its files, for a command without logs.
#[allow(clippy::print_stderr)]
fn warn_user(text: &str) {
    eprintln!("warning: {text}");
}

/// Writes command output to stdout (the one place the binary prints results).
#[allow(clippy::print_stdout)]
fn print(text: &str) {
    print!("{text}");
}

/// Logs go to stderr, filtered by `level` (tracing directives), text or JSON lines.
fn init_logging(format: LogFormat, level: &str) {
    // kube's client logs every failed connection at ERROR; the observers already report
    // a failing source once per change, so that line would repeat every second.
    let filter = EnvFilter::new(format!("{level},kube_client::client::builder=off"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}
