//! HTTP GETs with curl (installed by the build step): the API server as one identity, the
//! status of any URL, and what a status or a Node's JSON says about readiness.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;

use crate::wait::Probe;

/// Ready on HTTP 200; otherwise what was answered (0: nothing within 5 s).
pub(crate) fn http_probe(status: u16) -> Probe<()> {
    match status {
        200 => Probe::Ready(()),
        status => Probe::Waiting(format!("HTTP {status}")),
    }
}

/// The API server as one identity, reached with curl (installed by the build step).
#[derive(Clone, Debug)]
pub(crate) struct ApiEndpoint {
    pub(crate) url: String,
    pub(crate) ca: PathBuf,
    pub(crate) token: String,
    /// The network namespace curl runs in (a LAN's, see [`lan`](super::lan)); `None`: this
    /// process's.
    pub(crate) netns: Option<PathBuf>,
}

impl ApiEndpoint {
    pub(crate) fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        self.get_within(path, CURL_TIMEOUT)
    }

    /// `GET path` within `timeout`: the HTTP status (0 when it cannot connect or times out)
    /// and the body.
    pub(crate) fn get_within(&self, path: &str, timeout: Duration) -> anyhow::Result<(u16, String)> {
        let ca = self.ca.display().to_string();
        let auth = format!("Authorization: Bearer {}", self.token);
        // Not curl's own User-Agent: the API server pretty-prints JSON for curl.
        let args = [
            "--cacert",
            &ca,
            "-H",
            &auth,
            "-H",
            "User-Agent: pod-checkpointer-xtask",
        ];
        let output = curl(
            self.netns.as_deref(),
            &format!("{}{path}", self.url),
            &args,
            timeout,
        )?;
        Ok(split_status(&output))
    }
}

/// How long a curl request may take, unless said otherwise.
const CURL_TIMEOUT: Duration = Duration::from_secs(5);

/// The HTTP status of `GET url` (0 when it cannot connect or times out), from the network
/// namespace `netns` (`None`: this process's).
pub(crate) fn http_status(netns: Option<&Path>, url: &str, args: &[&str]) -> u16 {
    curl(netns, url, args, CURL_TIMEOUT)
        .map(|out| split_status(&out).0)
        .unwrap_or(0)
}

/// `curl -s URL` within `timeout` from the network namespace `netns`, with the status code
/// appended on a line of its own.
fn curl(netns: Option<&Path>, url: &str, args: &[&str], timeout: Duration) -> anyhow::Result<String> {
    let mut command = match netns {
        Some(netns) => crate::command::in_netns(netns, "curl"),
        None => Command::new("curl"),
    };
    let output = command
        .args(["-s", "-w", "\n%{http_code}", "--max-time"])
        .arg(format!("{:.3}", timeout.as_secs_f64()))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .context("cannot run curl")?;
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Splits curl's output into the status code (its last line) and the body.
fn split_status(output: &str) -> (u16, String) {
    match output.rsplit_once('\n') {
        Some((body, code)) => (code.trim().parse().unwrap_or(0), body.to_owned()),
        None => (output.trim().parse().unwrap_or(0), String::new()),
    }
}

/// Ready when `GET` of a Node answered 200 with the Ready condition `True`; otherwise what
/// was answered.
pub(crate) fn node_ready_probe(answer: (u16, String)) -> Probe<()> {
    match answer {
        (200, body) if node_is_ready(&body) => Probe::Ready(()),
        (200, _) => Probe::Waiting("the Node is not Ready".into()),
        (status, _) => Probe::Waiting(format!("HTTP {status}")),
    }
}

/// Whether a Node's JSON has the condition `Ready` = `True` (the API server writes struct
/// fields in order, `type` then `status`; whitespace is ignored for pretty output).
fn node_is_ready(node_json: &str) -> bool {
    let compact: String = node_json.chars().filter(|c| !c.is_whitespace()).collect();
    compact.contains(r#"{"type":"Ready","status":"True""#)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_readiness_comes_from_the_ready_condition() {
        let ready = r#"{"status":{"conditions":[{"type":"MemoryPressure","status":"False"},{"type":"Ready","status":"True","reason":"KubeletReady"}]}}"#;
        let not_ready = r#"{"status":{"conditions":[{"type":"Ready","status":"False"}]}}"#;
        let pretty = "{\n  \"type\": \"Ready\",\n  \"status\": \"True\"\n}";
        assert!(node_is_ready(ready));
        assert!(!node_is_ready(not_ready));
        assert!(node_is_ready(pretty));
    }

    #[test]
    fn curl_output_splits_into_status_and_body() {
        assert_eq!(split_status("ok\n200"), (200, "ok".to_owned()));
        assert_eq!(split_status("\n000"), (0, String::new()));
        assert_eq!(
            split_status("{\"a\":1}\nline2\n404"),
            (404, "{\"a\":1}\nline2".to_owned())
        );
    }
}
