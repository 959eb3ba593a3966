//! The original's command line, run as `run` (issue 40, a true drop-in): bootkube's
//! `/checkpoint --lock-file=… --kubeconfig=… --checkpoint-grace-period=5m`, parsed the way
//! Go's `flag` package parses it (`-name`, `--name`, `-name=value`, `-name value`; boolean
//! flags take no separate value; parsing stops at the first argument that is not a flag),
//! with its defaults where they differ from ours, and each mapping said once the logger
//! runs. What the original accepted and ours has no use for (glog's file options, the CRI
//! call timeout) is accepted and said to be ignored; what it refused, ours refuses with the
//! same words and exit code 2.

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use crate::error::{Error, Result};

/// The original's lock file: the DaemonSet copy and the static copy of an existing
/// installation take it, so a drop-in must too (ours defaults to a root-only directory).
pub(crate) const ORIGINAL_LOCK_FILE: &str = "/var/run/lock/pod-checkpointer.lock";
/// The original's kubeconfig when none is named (it never reads `$KUBECONFIG`).
pub(crate) const ORIGINAL_KUBECONFIG: &str = "/etc/kubernetes/kubeconfig";
/// The original's CRI endpoint when none is named: the kubelet's dockershim.
pub(crate) const ORIGINAL_RUNTIME_ENDPOINT: &str = "unix:///var/run/dockershim.sock";

/// A command line of the original's, as `run` arguments.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Translated {
    /// `pod-checkpointer run …`, for the parser of our own flags.
    pub(crate) args: Vec<OsString>,
    /// What was mapped, defaulted or ignored, one line each, for the log.
    pub(crate) notes: Vec<String>,
}

/// The original's flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flag {
    LockFile,
    Kubeconfig,
    RuntimeEndpoint,
    RuntimeRequestTimeout,
    GracePeriod,
    /// glog's `-v`: its verbosity.
    Verbosity,
    /// A glog flag with nothing to do here (ours logs to stderr, with tracing); `true`: a
    /// boolean one.
    Glog(bool),
}

impl Flag {
    fn named(name: &str) -> Option<Flag> {
        Some(match name {
            "lock-file" => Flag::LockFile,
            "kubeconfig" => Flag::Kubeconfig,
            "container-runtime-endpoint" => Flag::RuntimeEndpoint,
            "runtime-request-timeout" => Flag::RuntimeRequestTimeout,
            "checkpoint-grace-period" => Flag::GracePeriod,
            "v" => Flag::Verbosity,
            "logtostderr" | "alsologtostderr" => Flag::Glog(true),
            "stderrthreshold" | "vmodule" | "log_dir" | "log_backtrace_at" => Flag::Glog(false),
            _ => return None,
        })
    }
}

/// Whether a command line is the original's rather than ours: the binary called as the
/// original's `checkpoint` (its image's `/checkpoint`), or a first argument that is a flag
/// (ours always starts with a subcommand). Help and version stay ours.
pub(crate) fn is_original(args: &[OsString]) -> bool {
    let called_checkpoint = (args.first())
        .and_then(|a| Path::new(a).file_name())
        .is_some_and(|n| n == "checkpoint");
    match args.get(1).and_then(|a| a.to_str()) {
        None => called_checkpoint && args.len() == 1,
        Some("-h" | "--help" | "-help" | "-V" | "--version") => false,
        Some(first) => first.starts_with('-') && first != "-",
    }
}

/// The original's command line as `run`'s. `args[0]` is the program.
///
/// # Errors
///
/// What Go's `flag` package refuses (an unknown flag, a missing value, a bad boolean, a
/// bad duration) and what the original refused (a CRI endpoint that is not a unix
/// socket), as usage errors.
pub(crate) fn translate(args: &[OsString]) -> Result<Translated> {
    let mut out: Vec<OsString> = vec![
        args.first().cloned().unwrap_or_else(|| "pod-checkpointer".into()),
        "run".into(),
    ];
    let mut notes =
        vec!["started with the original's (bootkube's) command line: running as `run`".to_owned()];
    let (mut lock_file, mut kubeconfig, mut endpoint) = (None, None, None);
    let mut rest = args.iter().skip(1);
    while let Some(arg) = rest.next() {
        let arg = arg
            .to_str()
            .ok_or_else(|| Error::usage_message(format!("{arg:?}: an argument that is not UTF-8")))?;
        if arg == "--" {
            let ignored = rest.len();
            if ignored > 0 {
                notes.push(format!(
                    "{ignored} argument(s) after `--` ignored, as the original did"
                ));
            }
            break;
        }
        let Some(body) = arg
            .strip_prefix("--")
            .or_else(|| arg.strip_prefix('-'))
            .filter(|_| arg != "-")
        else {
            // Go's flag package stops at the first argument that is not a flag; the
            // original never read the rest.
            notes.push(format!(
                "{} argument(s) from {arg:?} on ignored, as the original did",
                rest.len() + 1
            ));
            break;
        };
        if body.is_empty() || body.starts_with(['-', '=']) {
            return Err(Error::usage_message(format!("bad flag syntax: {arg}")));
        }
        let (name, inline) = match body.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (body, None),
        };
        let flag = Flag::named(name).ok_or_else(|| {
            Error::usage_message(format!(
                "flag provided but not defined: -{name} (the original's flags: -lock-file, -kubeconfig, \
                 -container-runtime-endpoint, -runtime-request-timeout, -checkpoint-grace-period, and \
                 glog's -v, -logtostderr, -alsologtostderr, -stderrthreshold, -vmodule, -log_dir, \
                 -log_backtrace_at; ours start with a subcommand, see --help)"
            ))
        })?;
        if let Flag::Glog(true) = flag {
            let value = inline.unwrap_or("true");
            go_bool(value).ok_or_else(|| {
                Error::usage_message(format!(
                    "invalid boolean value {value:?} for -{name}: parse error"
                ))
            })?;
            notes.push(format!("-{name} ignored: the agent logs to stderr"));
            continue;
        }
        let value = match inline {
            Some(v) => v.to_owned(),
            None => rest
                .next()
                .and_then(|v| v.to_str())
                .ok_or_else(|| Error::usage_message(format!("flag needs an argument: -{name}")))?
                .to_owned(),
        };
        match flag {
            Flag::LockFile => lock_file = Some(value),
            Flag::Kubeconfig => kubeconfig = Some(value),
            Flag::RuntimeEndpoint => endpoint = Some(unix_endpoint(&value, &mut notes)?),
            Flag::RuntimeRequestTimeout => {
                go_duration(name, &value)?;
                notes.push(format!(
                    "-runtime-request-timeout={value} ignored: the agent bounds each CRI call itself (5 s) \
                     and a whole look at the runtime"
                ));
            }
            Flag::GracePeriod => {
                let grace = go_duration(name, &value)?;
                out.push("--checkpoint-grace-period".into());
                out.push(format!("{}ms", grace.as_millis()).into());
                notes.push(format!(
                    "-checkpoint-grace-period={value} → --checkpoint-grace-period"
                ));
            }
            Flag::Verbosity => {
                let level: u32 = value.parse().map_err(|_| {
                    Error::usage_message(format!("invalid value {value:?} for flag -v: parse error"))
                })?;
                // The original logs its detail at V(4).
                let filter = match level {
                    0..=3 => "info",
                    4..=5 => "debug",
                    _ => "trace",
                };
                out.push("--log-level".into());
                out.push(filter.into());
                notes.push(format!("-v={level} → --log-level {filter}"));
            }
            Flag::Glog(_) => notes.push(format!("-{name} ignored: the agent logs to stderr")),
        }
    }
    let mut defaulted = |flag: &str, given: Option<String>, original: &str, why: &str| {
        let value = given.clone().unwrap_or_else(|| original.to_owned());
        match given {
            Some(_) => notes.push(format!("-{flag}={value} → --{}", ours(flag))),
            None => notes.push(format!(
                "--{} {value}: the original's default ({why})",
                ours(flag)
            )),
        }
        out.push(format!("--{}", ours(flag)).into());
        out.push(value.into());
    };
    defaulted(
        "lock-file",
        lock_file,
        ORIGINAL_LOCK_FILE,
        "the copies of an installation share it",
    );
    defaulted(
        "kubeconfig",
        kubeconfig,
        ORIGINAL_KUBECONFIG,
        "it never read $KUBECONFIG",
    );
    defaulted(
        "container-runtime-endpoint",
        endpoint,
        ORIGINAL_RUNTIME_ENDPOINT,
        "the kubelet's dockershim; name the runtime's socket with -container-runtime-endpoint",
    );
    Ok(Translated { args: out, notes })
}

/// Our flag for one of the original's that maps one to one.
fn ours(flag: &str) -> &str {
    match flag {
        "container-runtime-endpoint" => "runtime-endpoint",
        other => other,
    }
}

/// The original's CRI endpoint rule: unix sockets only; a bare path is one (deprecated).
fn unix_endpoint(value: &str, notes: &mut Vec<String>) -> Result<String> {
    if value.starts_with("unix://") {
        return Ok(value.to_owned());
    }
    if value.contains("://") {
        return Err(Error::usage_message(format!(
            "-container-runtime-endpoint={value}: only support unix socket endpoint (as the original)"
        )));
    }
    notes.push(format!(
        "-container-runtime-endpoint={value}: a bare path is a unix socket (deprecated, as in the original)"
    ));
    Ok(format!("unix://{value}"))
}

/// Go's `strconv.ParseBool`.
fn go_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// A Go duration (`time.ParseDuration`: `300ms`, `1.5m`, `2h45m`, `0`), through jiff's
/// parser, which reads Go's format (and more); negative ones are refused, as a grace
/// period or a timeout cannot be.
fn go_duration(flag: &str, value: &str) -> Result<Duration> {
    let invalid =
        |why: &str| Error::usage_message(format!("invalid value {value:?} for flag -{flag}: {why}"));
    if value == "0" {
        return Ok(Duration::ZERO);
    }
    // jiff reads `1h30m` and `1.5m` as Go does; a Go duration has no spaces and no ISO 8601
    // form, so those (which jiff also reads) are refused, as Go would.
    if value.is_empty() || value.contains(char::is_whitespace) || value.to_ascii_uppercase().starts_with('P')
    {
        return Err(invalid("not a Go duration (e.g. 300ms, 1.5m, 2h45m)"));
    }
    let parsed: jiff::SignedDuration = value
        .parse()
        .map_err(|e: jiff::Error| invalid(&format!("not a Go duration (e.g. 300ms, 1.5m, 2h45m): {e}")))?;
    Duration::try_from(parsed).map_err(|_| invalid("a duration cannot be negative here"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &[&str]) -> Vec<OsString> {
        line.iter().map(OsString::from).collect()
    }

    /// The translated arguments after `run`, or the error's message.
    fn check(line: &[&str], expected: std::result::Result<&[&str], &str>) {
        let got = translate(&args(line)).map(|t| {
            (t.args.iter().skip(2))
                .map(|a| a.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
        });
        match (got, expected) {
            (Ok(got), Ok(expected)) => assert_eq!(got, expected, "{line:?}"),
            (Err(e), Err(expected)) => {
                let message = ckpt_core::error_chain(&e);
                assert!(message.contains(expected), "{line:?}: {message}");
                assert_eq!(e.exit_code(), 2, "{line:?}");
            }
            (got, expected) => panic!("{line:?}: {got:?}, expected {expected:?}"),
        }
    }

    /// `run`'s arguments for what the original's command line mapped (`mapped`), then the
    /// lock file, kubeconfig and CRI endpoint it named or defaulted, in that order.
    fn run_args<'a>(mapped: &[&'a str], [lock, kubeconfig, endpoint]: [&'a str; 3]) -> Vec<&'a str> {
        let named = [
            "--lock-file",
            lock,
            "--kubeconfig",
            kubeconfig,
            "--runtime-endpoint",
            endpoint,
        ];
        mapped.iter().copied().chain(named).collect()
    }

    #[test]
    fn the_original_command_lines_run_as_run() {
        let defaults = [ORIGINAL_LOCK_FILE, ORIGINAL_KUBECONFIG, ORIGINAL_RUNTIME_ENDPOINT];
        let cases: Vec<(&[&str], Vec<&str>)> = vec![
            // The original's rendered DaemonSet.
            (
                &[
                    "/checkpoint",
                    "--lock-file=/var/run/lock/pod-checkpointer.lock",
                    "--kubeconfig=/etc/checkpointer/kubeconfig",
                    "--checkpoint-grace-period=5m",
                ],
                run_args(
                    &["--checkpoint-grace-period", "300000ms"],
                    [
                        "/var/run/lock/pod-checkpointer.lock",
                        "/etc/checkpointer/kubeconfig",
                        ORIGINAL_RUNTIME_ENDPOINT,
                    ],
                ),
            ),
            (&["/checkpoint"], run_args(&[], defaults)),
            // Go's spellings: one dash, a separate value, a boolean alone, fractions.
            (
                &[
                    "checkpoint",
                    "-container-runtime-endpoint",
                    "unix:///run/containerd/containerd.sock",
                    "-logtostderr",
                    "-v=4",
                    "-checkpoint-grace-period",
                    "1.5m",
                    "-runtime-request-timeout=2m",
                ],
                run_args(
                    &["--log-level", "debug", "--checkpoint-grace-period", "90000ms"],
                    [
                        ORIGINAL_LOCK_FILE,
                        ORIGINAL_KUBECONFIG,
                        "unix:///run/containerd/containerd.sock",
                    ],
                ),
            ),
            (
                &["checkpoint", "--container-runtime-endpoint=/run/crio/crio.sock"],
                run_args(
                    &[],
                    [
                        ORIGINAL_LOCK_FILE,
                        ORIGINAL_KUBECONFIG,
                        "unix:///run/crio/crio.sock",
                    ],
                ),
            ),
            // Parsing stops at the first argument that is not a flag.
            (
                &["checkpoint", "--checkpoint-grace-period=1h30m", "stray", "-v=9"],
                run_args(&["--checkpoint-grace-period", "5400000ms"], defaults),
            ),
            (
                &["checkpoint", "-checkpoint-grace-period=0"],
                run_args(&["--checkpoint-grace-period", "0ms"], defaults),
            ),
        ];
        for (line, expected) in cases {
            check(line, Ok(&expected));
        }
    }

    #[test]
    fn what_the_original_refused_is_refused() {
        let cases: [(&[&str], &str); 9] = [
            (
                &["checkpoint", "--no-such-flag"],
                "flag provided but not defined: -no-such-flag",
            ),
            (
                &["checkpoint", "--kubeconfig"],
                "flag needs an argument: -kubeconfig",
            ),
            (&["checkpoint", "---lock-file=x"], "bad flag syntax"),
            (&["checkpoint", "-=x"], "bad flag syntax"),
            (&["checkpoint", "-logtostderr=maybe"], "invalid boolean value"),
            (&["checkpoint", "-v=high"], "invalid value \"high\" for flag -v"),
            (
                &["checkpoint", "-checkpoint-grace-period=5 minutes"],
                "not a Go duration",
            ),
            (
                &["checkpoint", "-checkpoint-grace-period=-1m"],
                "cannot be negative",
            ),
            (
                &["checkpoint", "-container-runtime-endpoint=tcp://10.0.0.1:1234"],
                "only support unix socket endpoint",
            ),
        ];
        for (line, message) in cases {
            check(line, Err(message));
        }
    }

    #[test]
    fn ours_stay_ours() {
        let cases: [(&[&str], bool); 9] = [
            (&["pod-checkpointer", "run"], false),
            (&["pod-checkpointer", "inspect", "-o", "json"], false),
            (&["pod-checkpointer", "--help"], false),
            (&["pod-checkpointer", "--version"], false),
            (&["pod-checkpointer"], false),
            (&["/checkpoint"], true),
            (&["/checkpoint", "-help"], false),
            (&["pod-checkpointer", "--lock-file=/x"], true),
            (&["/usr/bin/pod-checkpointer", "-v=2"], true),
        ];
        for (line, original) in cases {
            assert_eq!(is_original(&args(line)), original, "{line:?}");
        }
    }

    #[test]
    fn every_mapping_is_said() {
        let t = translate(&args(&[
            "checkpoint",
            "--kubeconfig=/k",
            "-alsologtostderr",
            "-log_dir=/tmp",
        ]))
        .expect("the original's flags");
        let notes = t.notes.join("\n");
        for said in [
            "running as `run`",
            "-kubeconfig=/k → --kubeconfig",
            "-alsologtostderr ignored",
            "-log_dir ignored",
            "--lock-file /var/run/lock/pod-checkpointer.lock: the original's default",
            "--runtime-endpoint unix:///var/run/dockershim.sock: the original's default",
        ] {
            assert!(notes.contains(said), "{said:?} in:\n{notes}");
        }
    }
}
