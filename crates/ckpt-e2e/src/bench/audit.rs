//! The agent's requests to the API server, counted from the kube-apiserver's audit log
//! (`ControlPlane::audit_log`: JSON lines, `RequestReceived` omitted). A window is a byte range
//! of the log: the API server writes each event with one `write`, so the length of the file
//! taken before and after the window splits it at event boundaries.
//!
//! Watches are the exception: v1.20 writes a quiet watch's `ResponseStarted` event only when
//! it ends, together with `ResponseComplete`. So watches are read from the log after the agent
//! has stopped (which ends them), as spans from `requestReceivedTimestamp` to the end, and
//! compared with the window's wall-clock bounds.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use anyhow::Context;
use serde_json::{Value, json};

/// Requests of one user, split the way the targets (ARCHITECTURE.md, Targets) count them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ApiRequests {
    /// Resource requests other than watches, by verb (`get`, `list`, `create`, …).
    pub(crate) by_verb: BTreeMap<String, u64>,
    /// Health probes: `GET /readyz`, `/healthz`, `/livez` (non-resource URLs).
    pub(crate) probes: u64,
    /// Other non-resource requests (discovery, `/version`).
    pub(crate) other: u64,
}

impl ApiRequests {
    /// Every request except watches and probes: what the targets want at 0.
    pub(crate) fn resource_requests(&self) -> u64 {
        self.by_verb.values().sum::<u64>() + self.other
    }

    pub(crate) fn to_json(&self, window_secs: f64) -> Value {
        let per_minute = |n: u64| n as f64 * 60.0 / window_secs;
        json!({
            "by_verb": self.by_verb,
            "probes": self.probes,
            "other_non_resource": self.other,
            "requests_besides_watches_and_probes": self.resource_requests(),
            "per_minute": {
                "besides_watches_and_probes": per_minute(self.resource_requests()),
                "probes": per_minute(self.probes),
            },
        })
    }
}

/// The audit log's length now: a window boundary.
pub(crate) fn log_len(log: &Path) -> anyhow::Result<u64> {
    Ok(std::fs::metadata(log)
        .with_context(|| format!("no audit log at {}", log.display()))?
        .len())
}

/// The requests of `user` whose events were written between the byte offsets `from` and `to`.
pub(crate) fn requests_between(log: &Path, from: u64, to: u64, user: &str) -> anyhow::Result<ApiRequests> {
    Ok(count_requests(&read_between(log, from, to)?, user))
}

/// The log's text between the byte offsets `from` and `to`.
pub(crate) fn read_between(log: &Path, from: u64, to: u64) -> anyhow::Result<String> {
    let mut file = File::open(log).with_context(|| format!("cannot open {}", log.display()))?;
    file.seek(SeekFrom::Start(from))?;
    let mut text = String::new();
    file.take(to.saturating_sub(from))
        .read_to_string(&mut text)
        .with_context(|| format!("cannot read {}", log.display()))?;
    Ok(text)
}

/// Counts the requests of `user` in audit-log lines, watches aside: one `ResponseComplete`
/// (or `Panic`) event per request. Lines that are not audit events are skipped.
pub(crate) fn count_requests(lines: &str, user: &str) -> ApiRequests {
    let mut requests = ApiRequests::default();
    for event in lines
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
    {
        if event["user"]["username"] != user {
            continue;
        }
        let stage = event["stage"].as_str().unwrap_or("");
        let verb = event["verb"].as_str().unwrap_or("");
        if verb == "watch" {
            continue;
        }
        if stage != "ResponseComplete" && stage != "Panic" {
            continue;
        }
        if event.get("objectRef").is_some_and(Value::is_object) {
            *requests.by_verb.entry(verb.to_owned()).or_default() += 1;
            continue;
        }
        let uri = event["requestURI"].as_str().unwrap_or("");
        let path = uri.split('?').next().unwrap_or("");
        if matches!(path, "/readyz" | "/healthz" | "/livez") {
            requests.probes += 1;
        } else {
            requests.other += 1;
        }
    }
    requests
}

/// One watch: the resource and when it was opened and ended (the audit log's timestamps,
/// `2026-12-02T16:30:05.123456Z`, which compare as strings).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WatchSpan {
    pub(crate) resource: String,
    pub(crate) opened: String,
    pub(crate) ended: String,
}

/// The ended watches of `user` in audit-log lines.
pub(crate) fn watch_spans(lines: &str, user: &str) -> Vec<WatchSpan> {
    lines
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|e| e["user"]["username"] == user && e["verb"] == "watch")
        .filter(|e| e["stage"] == "ResponseComplete" || e["stage"] == "Panic")
        .map(|e| {
            let text = |v: &Value| v.as_str().unwrap_or("").to_owned();
            WatchSpan {
                resource: text(&e["objectRef"]["resource"]),
                opened: text(&e["requestReceivedTimestamp"]),
                ended: text(&e["stageTimestamp"]),
            }
        })
        .collect()
}

/// The watches of `user` whose events were written between the byte offsets `from` and `to`.
pub(crate) fn watches_between(log: &Path, from: u64, to: u64, user: &str) -> anyhow::Result<Vec<WatchSpan>> {
    Ok(watch_spans(&read_between(log, from, to)?, user))
}

/// What the watches did during the window `[start, end)` (audit-log timestamps).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct WatchesInWindow {
    /// Opened inside the window: re-established watches.
    pub(crate) opened: u64,
    /// Open throughout the window, by resource.
    pub(crate) held: BTreeMap<String, u64>,
}

pub(crate) fn watches_in_window(spans: &[WatchSpan], start: &str, end: &str) -> WatchesInWindow {
    let mut window = WatchesInWindow::default();
    for span in spans {
        if span.opened.as_str() >= start && span.opened.as_str() < end {
            window.opened += 1;
        } else if span.opened.as_str() < start && span.ended.as_str() >= end {
            *window.held.entry(span.resource.clone()).or_default() += 1;
        }
    }
    window
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(user: &str, verb: &str, stage: &str, uri: &str, resource: bool) -> String {
        let mut e = json!({
            "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
            "auditID": "x", "stage": stage, "requestURI": uri, "verb": verb,
            "user": {"username": user, "groups": ["system:authenticated"]},
        });
        if resource {
            e["objectRef"] = json!({"resource": "pods", "namespace": "ns", "apiVersion": "v1"});
        }
        e.to_string()
    }

    fn check(lines: &[String], expected: (&[(&str, u64)], u64, u64)) {
        let got = count_requests(&lines.join("\n"), "pod-checkpointer");
        let by_verb: BTreeMap<String, u64> = expected.0.iter().map(|(v, n)| ((*v).to_owned(), *n)).collect();
        let want = ApiRequests {
            by_verb,
            probes: expected.1,
            other: expected.2,
        };
        assert_eq!(got, want, "{lines:?}");
    }

    #[test]
    fn requests_are_split_into_verbs_watches_and_probes() {
        let agent = "pod-checkpointer";
        check(&[], (&[], 0, 0));
        check(
            &[
                event(
                    agent,
                    "list",
                    "ResponseComplete",
                    "/api/v1/namespaces/ns/pods?limit=500",
                    true,
                ),
                event(
                    agent,
                    "get",
                    "ResponseComplete",
                    "/api/v1/namespaces/ns/secrets/s",
                    true,
                ),
                event(
                    agent,
                    "get",
                    "ResponseComplete",
                    "/api/v1/namespaces/ns/secrets/t",
                    true,
                ),
                // A watch: started in the window, ended in it, or ended only (opened before).
                event(
                    agent,
                    "watch",
                    "ResponseStarted",
                    "/api/v1/namespaces/ns/pods?watch=1",
                    true,
                ),
                event(
                    agent,
                    "watch",
                    "ResponseComplete",
                    "/api/v1/namespaces/ns/pods?watch=1",
                    true,
                ),
                event(
                    agent,
                    "watch",
                    "ResponseComplete",
                    "/api/v1/namespaces/ns/pods?watch=1",
                    true,
                ),
                event(agent, "get", "ResponseComplete", "/readyz", false),
                event(agent, "get", "ResponseComplete", "/readyz?verbose", false),
                event(agent, "get", "ResponseComplete", "/version", false),
                event(agent, "create", "Panic", "/api/v1/namespaces/ns/events", true),
                // Not the agent, not a complete request, not JSON.
                event("admin", "list", "ResponseComplete", "/api/v1/pods", true),
                event(
                    agent,
                    "get",
                    "ResponseStarted",
                    "/api/v1/namespaces/ns/pods/p",
                    true,
                ),
                "garbage".to_owned(),
            ],
            (&[("create", 1), ("get", 2), ("list", 1)], 2, 1),
        );
    }

    fn watch(user: &str, resource: &str, stage: &str, opened: &str, ended: &str) -> String {
        json!({
            "kind": "Event", "stage": stage, "verb": "watch", "user": {"username": user},
            "objectRef": {"resource": resource}, "requestURI": "/api/v1/pods?watch=true",
            "requestReceivedTimestamp": opened, "stageTimestamp": ended,
        })
        .to_string()
    }

    #[test]
    fn watches_are_spans_compared_with_the_window() {
        let agent = "pod-checkpointer";
        let t = |s: u32| format!("2026-12-02T16:{:02}:{:02}.000000Z", s / 60, s % 60);
        let lines = [
            watch(agent, "pods", "ResponseStarted", &t(0), &t(300)),
            watch(agent, "pods", "ResponseComplete", &t(0), &t(300)),
            watch(agent, "secrets", "ResponseComplete", &t(1), &t(300)),
            // Re-established inside the window.
            watch(agent, "pods", "ResponseComplete", &t(100), &t(300)),
            // Ended inside the window: not held throughout.
            watch(agent, "configmaps", "ResponseComplete", &t(1), &t(50)),
            watch("admin", "pods", "ResponseComplete", &t(0), &t(300)),
        ]
        .join("\n");
        let spans = watch_spans(&lines, agent);
        assert_eq!(spans.len(), 4);
        let window = watches_in_window(&spans, &t(10), &t(130));
        assert_eq!(window.opened, 1);
        assert_eq!(
            window.held,
            BTreeMap::from([("pods".to_owned(), 1), ("secrets".to_owned(), 1)])
        );
    }

    #[test]
    fn besides_watches_and_probes_counts_verbs_and_other_paths() {
        let requests = count_requests(
            &[
                event(
                    "pod-checkpointer",
                    "list",
                    "ResponseComplete",
                    "/api/v1/pods",
                    true,
                ),
                event("pod-checkpointer", "get", "ResponseComplete", "/api", false),
                event("pod-checkpointer", "get", "ResponseComplete", "/livez", false),
            ]
            .join("\n"),
            "pod-checkpointer",
        );
        assert_eq!(requests.resource_requests(), 2);
        let json = requests.to_json(120.0);
        assert_eq!(json["per_minute"]["besides_watches_and_probes"], 1.0);
        assert_eq!(json["per_minute"]["probes"], 0.5);
    }
}
