//! The fleet's figures from what the bench records: the API server's audit log (one request
//! per `auditID` of a fleet agent's user) and the agents' JSON logs. Pure functions over
//! text and times, so each rule has a table of cases.

use std::collections::BTreeMap;

use ckpt_core::Timestamp;
use serde_json::Value;

/// One request of a fleet agent, from the audit log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Request {
    pub(crate) user: String,
    /// `get`, `list`, `watch`, `create`, … (`get` for non-resource URLs too).
    pub(crate) verb: String,
    /// The resource (`pods`, `secrets`, `nodes`, `serviceaccounts/token`) or, for a
    /// non-resource request, its path (`/readyz`).
    pub(crate) resource: String,
    pub(crate) namespace: String,
    /// What selects the objects of a list or watch: its object name or `fieldSelector`.
    pub(crate) selector: String,
    /// When the API server received it.
    pub(crate) at: Timestamp,
    /// The response's status code, if one was sent.
    pub(crate) code: Option<u16>,
}

impl Request {
    /// `verb resource`, e.g. `list pods`, `get /readyz`.
    pub(crate) fn kind(&self) -> String {
        format!("{} {}", self.verb, self.resource)
    }
}

/// The requests of the members of `group` in audit-log lines, one per `auditID` (a watch
/// has a `ResponseStarted` and a `ResponseComplete` event, or only one of them: an API
/// server killed under it writes neither end), in the order first seen. Lines that are not
/// audit events, or not the group's, are skipped.
pub(crate) fn requests(lines: &str, group: &str) -> Vec<Request> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out: Vec<Request> = Vec::new();
    for event in lines
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
    {
        let member = event["user"]["groups"]
            .as_array()
            .is_some_and(|groups| groups.iter().any(|g| g == group));
        let stage = event["stage"].as_str().unwrap_or("");
        if !member || !matches!(stage, "ResponseStarted" | "ResponseComplete" | "Panic") {
            continue;
        }
        let text = |v: &Value| v.as_str().unwrap_or("").to_owned();
        let code = event["responseStatus"]["code"]
            .as_u64()
            .and_then(|c| u16::try_from(c).ok());
        let id = text(&event["auditID"]);
        if let Some(&i) = seen.get(&id) {
            // The complete event has the final code.
            if code.is_some() {
                out[i].code = code;
            }
            continue;
        }
        let uri = text(&event["requestURI"]);
        let (path, query) = uri.split_once('?').unwrap_or((&uri, ""));
        let object = &event["objectRef"];
        let (resource, namespace, selector) = if object.is_object() {
            let mut resource = text(&object["resource"]);
            if let Some(sub) = object["subresource"].as_str() {
                resource = format!("{resource}/{sub}");
            }
            let selector = match object["name"].as_str() {
                Some(name) => name.to_owned(),
                None => query_param(query, "fieldSelector").unwrap_or_default(),
            };
            (resource, text(&object["namespace"]), selector)
        } else {
            (path.to_owned(), String::new(), String::new())
        };
        let Some(at) = Timestamp::parse_rfc3339(event["requestReceivedTimestamp"].as_str().unwrap_or(""))
        else {
            continue;
        };
        seen.insert(id, out.len());
        out.push(Request {
            user: text(&event["user"]["username"]),
            verb: text(&event["verb"]),
            resource,
            namespace,
            selector,
            at,
            code,
        });
    }
    out
}

/// A query parameter's value, percent-decoded (`spec.nodeName%3Dnode-0001`).
fn query_param(query: &str, name: &str) -> Option<String> {
    query
        .split('&')
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
        .map(percent_decode)
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The requests received in `[from, to)`.
pub(crate) fn within(requests: &[Request], from: Timestamp, to: Timestamp) -> impl Iterator<Item = &Request> {
    requests.iter().filter(move |r| r.at >= from && r.at < to)
}

/// How many requests of each kind (`verb resource`).
pub(crate) fn by_kind<'a>(requests: impl Iterator<Item = &'a Request>) -> BTreeMap<String, u64> {
    let mut kinds = BTreeMap::new();
    for r in requests {
        *kinds.entry(r.kind()).or_default() += 1;
    }
    kinds
}

/// Requests in each of the `seconds` whole seconds from `from`.
pub(crate) fn per_second(requests: &[Request], from: Timestamp, seconds: usize) -> Vec<u64> {
    let mut bins = vec![0; seconds];
    for r in requests.iter().filter(|r| r.at >= from) {
        let second = usize::try_from((r.at.0 - from.0) / 1000).unwrap_or(usize::MAX);
        if let Some(bin) = bins.get_mut(second) {
            *bin += 1;
        }
    }
    bins
}

/// Lists per watched object of one agent: `(user, resource, namespace, selector)` → how many
/// lists, for the lists among `requests`.
pub(crate) fn lists_per_object<'a>(
    requests: impl Iterator<Item = &'a Request>,
) -> BTreeMap<(String, String, String, String), u64> {
    let mut lists = BTreeMap::new();
    for r in requests.filter(|r| r.verb == "list") {
        let key = (
            r.user.clone(),
            r.resource.clone(),
            r.namespace.clone(),
            r.selector.clone(),
        );
        *lists.entry(key).or_default() += 1;
    }
    lists
}

/// One line of an agent's JSON log (`--log-format=json`): when, the message, and its `to`
/// field (the new API state of "API server state changed").
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LogLine {
    pub(crate) at: Timestamp,
    pub(crate) message: String,
    pub(crate) to: String,
}

pub(crate) fn log_lines(text: &str) -> Vec<LogLine> {
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|line| {
            Some(LogLine {
                at: Timestamp::parse_rfc3339(line["timestamp"].as_str()?)?,
                message: line["message"].as_str()?.to_owned(),
                to: line["to"].as_str().unwrap_or("").to_owned(),
            })
        })
        .collect()
}

/// The agent's log says this happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Milestone {
    /// It found the API server unreachable.
    Unreachable,
    /// It activated a checkpoint.
    Activated,
    /// It deactivated one: the parent runs again.
    Deactivated,
    /// Its view of the API became complete and current again.
    Synced,
}

impl Milestone {
    fn matches(self, line: &LogLine) -> bool {
        match self {
            Milestone::Unreachable => line.message == "API server unreachable",
            Milestone::Activated => line.message == "checkpoint activated",
            Milestone::Deactivated => line.message.starts_with("checkpoint deactivated"),
            Milestone::Synced => line.message == "API server state changed" && line.to == "synced",
        }
    }
}

/// When `milestone` first happened at or after `since`.
pub(crate) fn first(lines: &[LogLine], milestone: Milestone, since: Timestamp) -> Option<Timestamp> {
    lines
        .iter()
        .filter(|l| l.at >= since && milestone.matches(l))
        .map(|l| l.at)
        .min()
}

/// From cumulative per-agent counters sampled over time (`samples[t][agent]`), the
/// attempts in each interval: the fleet's total, and how many agents made at least one.
pub(crate) fn attempts_per_interval(samples: &[Vec<u64>]) -> Vec<(u64, usize)> {
    samples
        .windows(2)
        .map(|pair| {
            let deltas = pair[1].iter().zip(&pair[0]).map(|(b, a)| b.saturating_sub(*a));
            deltas.fold((0, 0), |(total, agents), d| {
                (total + d, agents + usize::from(d > 0))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(
        id: &str,
        stage: &str,
        user: &str,
        verb: &str,
        uri: &str,
        object: &str,
        code: Option<u16>,
    ) -> String {
        let object = if object.is_empty() {
            String::new()
        } else {
            format!(r#","objectRef":{object}"#)
        };
        let status = code.map_or(String::new(), |c| format!(r#","responseStatus":{{"code":{c}}}"#));
        format!(
            r#"{{"auditID":"{id}","stage":"{stage}","verb":"{verb}","requestURI":"{uri}","user":{{"username":"{user}","groups":["pod-checkpointer:fleet","system:authenticated"]}},"requestReceivedTimestamp":"2026-12-06T20:00:0{id}.250000Z"{object}{status}}}"#
        )
    }

    #[test]
    fn audit_events_become_one_request_each() {
        let check = |lines: Vec<String>, expected: Vec<(&str, &str, &str, &str, Option<u16>)>| {
            let got = requests(&lines.join("\n"), "pod-checkpointer:fleet");
            let got: Vec<_> = (got.iter())
                .map(|r| {
                    (
                        r.kind(),
                        r.namespace.as_str(),
                        r.selector.as_str(),
                        r.user.as_str(),
                        r.code,
                    )
                })
                .collect();
            let expected: Vec<_> = (expected.into_iter())
                .map(|(kind, ns, selector, user, code)| (kind.to_owned(), ns, selector, user, code))
                .collect();
            assert_eq!(got, expected);
        };
        let watch_pods = r#"{"resource":"pods","namespace":"fleet","apiVersion":"v1"}"#;
        let token =
            r#"{"resource":"serviceaccounts","namespace":"fleet","name":"static","subresource":"token"}"#;
        let u = "pod-checkpointer-fleet-0001";
        // A probe.
        check(
            vec![event("1", "ResponseComplete", u, "get", "/readyz", "", Some(200))],
            vec![("get /readyz", "", "", u, Some(200))],
        );
        // A watch's two events are one request, with the final code.
        check(
            vec![
                event(
                    "2",
                    "ResponseStarted",
                    u,
                    "watch",
                    "/api/v1/namespaces/fleet/pods?fieldSelector=spec.nodeName%3Dnode-0001&watch=true",
                    watch_pods,
                    Some(200),
                ),
                event(
                    "2",
                    "ResponseComplete",
                    u,
                    "watch",
                    "/api/v1/namespaces/fleet/pods?fieldSelector=spec.nodeName%3Dnode-0001&watch=true",
                    watch_pods,
                    Some(200),
                ),
            ],
            vec![("watch pods", "fleet", "spec.nodeName=node-0001", u, Some(200))],
        );
        // A watch cut by a killed API server: only its start.
        check(
            vec![event(
                "3",
                "ResponseStarted",
                u,
                "watch",
                "/api/v1/namespaces/fleet/pods?watch=1",
                watch_pods,
                None,
            )],
            vec![("watch pods", "fleet", "", u, None)],
        );
        // A subresource and a named object; a 429.
        check(
            vec![
                event(
                    "4",
                    "ResponseComplete",
                    u,
                    "create",
                    "/api/v1/namespaces/fleet/serviceaccounts/static/token",
                    token,
                    Some(201),
                ),
                event(
                    "5",
                    "ResponseComplete",
                    u,
                    "list",
                    "/api/v1/namespaces/fleet/pods?fieldSelector=spec.nodeName%3Dnode-0001",
                    watch_pods,
                    Some(429),
                ),
            ],
            vec![
                ("create serviceaccounts/token", "fleet", "static", u, Some(201)),
                ("list pods", "fleet", "spec.nodeName=node-0001", u, Some(429)),
            ],
        );
        // Not a fleet member, not an audit event, RequestReceived: skipped.
        let mut outsider = event("6", "ResponseComplete", "admin", "get", "/readyz", "", Some(200));
        outsider = outsider.replace("pod-checkpointer:fleet", "system:masters");
        check(
            vec![
                outsider,
                "not json".into(),
                event("7", "RequestReceived", u, "get", "/readyz", "", None),
            ],
            vec![],
        );
    }

    #[test]
    fn requests_fall_into_seconds_and_objects() {
        let at = |ms: i64| Timestamp(1_000_000 + ms);
        let request = |user: &str, verb: &str, ms: i64| Request {
            user: user.into(),
            verb: verb.into(),
            resource: "pods".into(),
            namespace: "fleet".into(),
            selector: "spec.nodeName=node-0001".into(),
            at: at(ms),
            code: Some(200),
        };
        let reqs = vec![
            request("a", "list", -1),
            request("a", "list", 0),
            request("a", "watch", 999),
            request("b", "list", 1000),
            request("a", "list", 2500),
            request("a", "list", 3000),
        ];
        assert_eq!(per_second(&reqs, at(0), 3), vec![2, 1, 1]);
        let lists = lists_per_object(within(&reqs, at(0), at(3000)));
        let count = |user: &str| lists.iter().find(|(k, _)| k.0 == user).map(|(_, n)| *n);
        assert_eq!((count("a"), count("b")), (Some(2), Some(1)));
        assert_eq!(
            by_kind(within(&reqs, at(0), at(3001))),
            BTreeMap::from([("list pods".to_owned(), 4), ("watch pods".to_owned(), 1)])
        );
    }

    #[test]
    fn milestones_come_from_the_json_log() {
        let log = [
            r#"{"timestamp":"2026-12-06T20:00:01.000000Z","level":"WARN","message":"API server unreachable","from":"synced"}"#,
            r#"{"timestamp":"2026-12-06T20:00:02.000000Z","level":"INFO","message":"checkpoint activated","pod":"fleet/a"}"#,
            r#"{"timestamp":"2026-12-06T20:00:09.000000Z","level":"INFO","message":"API server state changed","from":"unreachable","to":"reachable"}"#,
            r#"{"timestamp":"2026-12-06T20:00:10.000000Z","level":"INFO","message":"API server state changed","from":"reachable","to":"synced"}"#,
            r#"{"timestamp":"2026-12-06T20:00:11.000000Z","level":"INFO","message":"checkpoint deactivated: the parent runs again","pod":"fleet/a"}"#,
            "a line that is not JSON",
        ]
        .join("\n");
        let lines = log_lines(&log);
        let t = |s: &str| Timestamp::parse_rfc3339(&format!("2026-12-06T20:00:{s}Z"));
        let check = |milestone: Milestone, since: &str, expected: Option<&str>| {
            assert_eq!(
                first(&lines, milestone, t(since).unwrap()),
                expected.and_then(t),
                "{milestone:?} since {since}"
            );
        };
        check(Milestone::Unreachable, "00", Some("01"));
        check(Milestone::Activated, "00", Some("02"));
        check(Milestone::Activated, "03", None);
        check(Milestone::Synced, "00", Some("10"));
        check(Milestone::Deactivated, "10", Some("11"));
    }

    #[test]
    fn attempts_are_counted_per_interval_and_agent() {
        let check = |samples: Vec<Vec<u64>>, expected: Vec<(u64, usize)>| {
            assert_eq!(attempts_per_interval(&samples), expected);
        };
        check(vec![vec![0, 0, 0]], vec![]);
        check(vec![vec![0, 0, 0], vec![1, 0, 3]], vec![(4, 2)]);
        check(vec![vec![1, 1], vec![1, 1], vec![2, 1]], vec![(0, 0), (1, 1)]);
        // A counter that went back (rules reloaded) counts nothing.
        check(vec![vec![5], vec![2]], vec![(0, 0)]);
    }
}
