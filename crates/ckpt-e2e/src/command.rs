//! Running a command to completion, the one way ckpt-e2e and xtask do it: the exit status is
//! checked, and a failure names the command line, the status and, where the output is
//! captured, what the command said on stderr.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use anyhow::{Context, bail};

/// `nsenter --net=NETNS -- program`: `program` in the network namespace pinned at `netns`,
/// with this process's mounts, pids and user (a LAN's plane and clients, a node's probes).
pub fn in_netns(netns: &std::path::Path, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut command = Command::new("nsenter");
    command
        .arg(format!("--net={}", netns.display()))
        .arg("--")
        .arg(program);
    command
}

/// Runs `command` with stdin closed and its stdout and stderr captured (unless the caller
/// sent them elsewhere); returns its stdout, or fails with the command line, the exit status
/// and its stderr.
pub fn run_command(command: &mut Command) -> anyhow::Result<String> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {:?}", command.get_program()))?;
    checked_stdout(command, &output)
}

/// [`run_command`] with `input` on its stdin.
pub fn run_command_with_input(command: &mut Command, input: &str) -> anyhow::Result<String> {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {:?}", command.get_program()))?;
    if let Some(mut pipe) = child.stdin.take() {
        pipe.write_all(input.as_bytes())
            .with_context(|| format!("cannot write to {:?}", command.get_program()))?;
    }
    let output = child
        .wait_with_output()
        .with_context(|| format!("{:?} failed", command.get_program()))?;
    checked_stdout(command, &output)
}

/// The stdout of a finished `command`, or why it failed.
fn checked_stdout(command: &Command, output: &Output) -> anyhow::Result<String> {
    if !output.status.success() {
        let failed = format!("{} failed ({})", command_line(command), output.status);
        // Empty when it went elsewhere (the terminal, a log) rather than to us.
        let stderr = String::from_utf8_lossy(&output.stderr);
        match stderr.trim() {
            "" => bail!("{failed}"),
            said => bail!("{failed}: {said}"),
        }
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Runs `command` with the terminal's stdout and stderr (a build to watch); fails with the
/// command line and the exit status (its stderr is on the terminal already).
pub fn run_on_terminal(command: &mut Command) -> anyhow::Result<()> {
    let status = command
        .status()
        .with_context(|| format!("cannot run {:?}", command.get_program()))?;
    anyhow::ensure!(status.success(), "`{}` failed: {status}", command_line(command));
    Ok(())
}

/// `program arg…` of a command, for messages.
pub fn command_line(command: &Command) -> String {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_command_reports_its_line_and_stderr() {
        let error = run_command(Command::new("sh").args(["-c", "echo oops >&2; exit 3"]))
            .unwrap_err()
            .to_string();
        assert!(error.contains("sh -c echo oops >&2; exit 3 failed"), "{error}");
        assert!(error.contains("oops"), "{error}");
        assert_eq!(run_command(Command::new("echo").arg("hi")).unwrap(), "hi\n");
    }

    #[test]
    fn a_failure_with_its_stderr_elsewhere_ends_with_the_status() {
        let error = run_command(Command::new("sh").args(["-c", "exit 2"]).stderr(Stdio::inherit()))
            .unwrap_err()
            .to_string();
        assert!(error.ends_with("failed (exit status: 2)"), "{error}");
    }

    #[test]
    fn input_goes_to_stdin() {
        assert_eq!(
            run_command_with_input(&mut Command::new("cat"), "in\n").unwrap(),
            "in\n"
        );
        let error = run_command_with_input(Command::new("sh").args(["-c", "cat >&2; exit 1"]), "said")
            .unwrap_err()
            .to_string();
        assert!(error.ends_with("): said"), "{error}");
    }

    #[test]
    fn a_failure_on_the_terminal_names_the_command_and_status() {
        let err = run_on_terminal(Command::new("sh").args(["-c", "exit 4"]))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("`sh -c exit 4` failed: "), "{err}");
    }
}
