//! The fleet bench's results: JSON (everything, per-second series included), Markdown (a
//! table per size with the targets, and the scale table) and the plot, as
//! `target/bench/fleet-<timestamp>.{json,md,png}`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde_json::{Value, json};

use super::super::stats::Summary;
use super::super::utc::{compact_utc, iso_utc};
use super::plot;
use crate::e2e_env::Release;

/// What identifies a run.
pub(crate) struct Run {
    pub(crate) started_at: SystemTime,
    pub(crate) command: String,
    pub(crate) commit: String,
    pub(crate) machine: String,
    pub(crate) load_before: String,
    pub(crate) load_after: String,
    pub(crate) kubernetes: Release,
    /// The API server and etcd on CPU 0, the rest on CPU 1.
    pub(crate) pinned: bool,
    pub(crate) idle: Duration,
    pub(crate) outage: Duration,
    pub(crate) failures: Vec<String>,
}

/// One fleet size.
#[derive(Clone, Debug, Default)]
pub(crate) struct SizeResult {
    pub(crate) agents: usize,
    pub(crate) idle: Idle,
    pub(crate) outage: Outage,
    pub(crate) back: Return,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Idle {
    pub(crate) window_s: f64,
    /// The fleet's requests by `verb resource`.
    pub(crate) requests: BTreeMap<String, u64>,
    pub(crate) requests_per_second: f64,
    pub(crate) requests_per_second_per_agent: f64,
    /// Of one core.
    pub(crate) apiserver_cpu_percent: f64,
    pub(crate) apiserver_rss_mib: f64,
    pub(crate) agents_cpu_percent: f64,
    pub(crate) agents_rss_mib: f64,
    /// New connections to the API server, all agents.
    pub(crate) connections_opened: u64,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Outage {
    /// From the kill to the first `/readyz` 200 of the restarted API server.
    pub(crate) down_s: f64,
    /// Connection attempts of the whole fleet while it was down.
    pub(crate) attempts: u64,
    pub(crate) attempts_per_agent_per_second: f64,
    /// Each second: attempts, and agents that made one.
    pub(crate) attempts_per_second: Vec<u64>,
    pub(crate) agents_per_second: Vec<usize>,
    /// Agents that found the API unreachable, and how long after the kill.
    pub(crate) detected: usize,
    pub(crate) detection_s: Option<Summary>,
    /// The most agents that tried in one second once every agent had found it
    /// unreachable.
    pub(crate) max_agents_after_detection: usize,
    /// Agents that activated a checkpoint, and how long after the kill.
    pub(crate) activated: usize,
    pub(crate) activation_s: Option<Summary>,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Return {
    /// How much earlier than its first `/readyz` 200 the restarted server first answered
    /// a fleet request (a 403 while its authorizer loads counts): the start of the
    /// request figures below.
    pub(crate) answered_before_ready_s: f64,
    /// Requests received in each second of the first minute after that first answer.
    pub(crate) per_second: Vec<u64>,
    pub(crate) peak: u64,
    pub(crate) peak_second: usize,
    /// The peak second's requests by kind: its cause.
    pub(crate) peak_kinds: BTreeMap<String, u64>,
    /// The first minute's requests by kind.
    pub(crate) kinds: BTreeMap<String, u64>,
    pub(crate) http_429: u64,
    /// Requests forbidden in that minute (the authorizer not loaded yet).
    pub(crate) http_403: u64,
    /// Lists after the return, of how many distinct watched objects (agent, resource,
    /// namespace, selector), the most of one, and how many were listed more than twice.
    pub(crate) lists: u64,
    pub(crate) objects_listed: usize,
    pub(crate) max_lists_per_object: u64,
    pub(crate) objects_listed_more_than_twice: usize,
    /// Agents synced again, and when (seconds after the first `/readyz` 200).
    pub(crate) synced: usize,
    pub(crate) synced_s: Option<Summary>,
    /// Agents that retired their checkpoints (the parents run), and when.
    pub(crate) deactivated: usize,
    pub(crate) deactivated_s: Option<Summary>,
    /// Each second from the return: new connections, the API server's and the agents' CPU.
    pub(crate) connections_per_second: Vec<u64>,
    pub(crate) apiserver_cpu_percent: Vec<f64>,
    pub(crate) agents_cpu_percent: Vec<f64>,
}

impl Outage {
    /// The most agents that tried to connect in one second.
    fn max_agents_in_a_second(&self) -> usize {
        self.agents_per_second.iter().copied().max().unwrap_or(0)
    }
}

impl Return {
    fn apiserver_cpu_peak(&self) -> f64 {
        self.apiserver_cpu_percent.iter().copied().fold(0.0, f64::max)
    }
}

/// Where [`write`] put the results.
pub(crate) struct Paths {
    pub(crate) json: PathBuf,
    pub(crate) markdown: PathBuf,
    pub(crate) plot: PathBuf,
}

/// `fleet-<timestamp>`: the name of the run's files.
pub(crate) fn stem(started_at: SystemTime) -> String {
    let secs = started_at
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    format!("fleet-{}", compact_utc(secs))
}

pub(crate) fn write(dir: &Path, run: &Run, results: &[SizeResult]) -> anyhow::Result<Paths> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let stem = stem(run.started_at);
    let paths = Paths {
        json: dir.join(format!("{stem}.json")),
        markdown: dir.join(format!("{stem}.md")),
        plot: dir.join(format!("{stem}.png")),
    };
    let json = to_json(run, results);
    fs::write(&paths.json, serde_json::to_string_pretty(&json)?)
        .with_context(|| format!("cannot write {}", paths.json.display()))?;
    let plotted = plot::draw(&paths.plot, &plot_points(results), &run.commit);
    let mut md = markdown(run, results, &stem);
    if let Err(e) = plotted {
        let _ = writeln!(md, "\nThe plot could not be drawn: {e:#}");
    }
    fs::write(&paths.markdown, md).with_context(|| format!("cannot write {}", paths.markdown.display()))?;
    Ok(paths)
}

fn plot_points(results: &[SizeResult]) -> Vec<plot::Point> {
    results
        .iter()
        .map(|r| plot::Point {
            agents: r.agents,
            idle_per_second: r.idle.requests_per_second,
            return_peak: r.back.peak as f64,
            outage_attempts_per_second: r.outage.attempts as f64 / r.outage.down_s.max(1.0),
            synced_s: r.back.synced_s.map(|s| s.max),
            retired_s: r.back.deactivated_s.map(|s| s.max),
        })
        .collect()
}

fn summary_json(summary: Option<Summary>) -> Value {
    summary.map_or(
        Value::Null,
        |s| json!({ "n": s.n, "min_s": s.min, "median_s": s.median, "max_s": s.max }),
    )
}

fn to_json(run: &Run, results: &[SizeResult]) -> Value {
    let secs = run
        .started_at
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    json!({
        "started_at": iso_utc(secs),
        "command": run.command,
        "commit": run.commit,
        "machine": run.machine,
        "kubernetes": run.kubernetes.to_string(),
        "load_average": { "before": run.load_before, "after": run.load_after },
        "pinned": run.pinned,
        "idle_window_s": run.idle.as_secs_f64(),
        "outage_s": run.outage.as_secs_f64(),
        "failures": run.failures,
        "sizes": results.iter().map(|r| json!({
            "agents": r.agents,
            "idle": {
                "window_s": r.idle.window_s,
                "requests_by_kind": r.idle.requests,
                "requests_per_second": r.idle.requests_per_second,
                "requests_per_second_per_agent": r.idle.requests_per_second_per_agent,
                "apiserver_cpu_percent": r.idle.apiserver_cpu_percent,
                "apiserver_rss_mib": r.idle.apiserver_rss_mib,
                "agents_cpu_percent": r.idle.agents_cpu_percent,
                "agents_rss_mib": r.idle.agents_rss_mib,
                "connections_opened": r.idle.connections_opened,
            },
            "outage": {
                "down_s": r.outage.down_s,
                "connection_attempts": r.outage.attempts,
                "attempts_per_agent_per_second": r.outage.attempts_per_agent_per_second,
                "attempts_per_second": r.outage.attempts_per_second,
                "agents_trying_per_second": r.outage.agents_per_second,
                "max_agents_in_a_second": r.outage.max_agents_in_a_second(),
                "agents_detected": r.outage.detected,
                "detection_after_kill": summary_json(r.outage.detection_s),
                "max_agents_in_a_second_after_detection": r.outage.max_agents_after_detection,
                "agents_activated": r.outage.activated,
                "activation_after_kill": summary_json(r.outage.activation_s),
            },
            "return": {
                "requests_per_second": r.back.per_second,
                "peak_per_second": r.back.peak,
                "peak_second": r.back.peak_second,
                "peak_by_kind": r.back.peak_kinds,
                "first_minute_by_kind": r.back.kinds,
                "http_429": r.back.http_429,
                "http_403": r.back.http_403,
                "first_answer_before_first_readyz_200_s": r.back.answered_before_ready_s,
                "lists": r.back.lists,
                "objects_listed": r.back.objects_listed,
                "max_lists_per_object": r.back.max_lists_per_object,
                "objects_listed_more_than_twice": r.back.objects_listed_more_than_twice,
                "agents_synced": r.back.synced,
                "synced_after_ready": summary_json(r.back.synced_s),
                "agents_retired_checkpoints": r.back.deactivated,
                "retired_after_ready": summary_json(r.back.deactivated_s),
                "connections_per_second": r.back.connections_per_second,
                "apiserver_cpu_percent_per_second": r.back.apiserver_cpu_percent,
                "apiserver_cpu_peak_percent": r.back.apiserver_cpu_peak(),
                "agents_cpu_percent_per_second": r.back.agents_cpu_percent,
            },
        })).collect::<Vec<_>>(),
    })
}

/// `met` / `NOT met`.
fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "**NOT met**" }
}

fn kinds_text(kinds: &BTreeMap<String, u64>, per: f64) -> String {
    let mut sorted: Vec<_> = kinds.iter().collect();
    sorted.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let parts: Vec<String> = sorted
        .iter()
        .map(|(kind, n)| {
            if per == 1.0 {
                format!("{kind} {n}")
            } else {
                format!("{kind} {:.3}", **n as f64 / per)
            }
        })
        .collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

fn summary_text(summary: Option<Summary>, of: usize, n: usize) -> String {
    match summary {
        Some(s) => format!(
            "{of} of {n}; min {:.1} s, median {:.1} s, max **{:.1} s**",
            s.min, s.median, s.max
        ),
        None => format!("{of} of {n}"),
    }
}

fn markdown(run: &Run, results: &[SizeResult], stem: &str) -> String {
    let secs = run
        .started_at
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# A fleet of agents against one API server ({})\n",
        iso_utc(secs)
    );
    let _ = writeln!(md, "- command: `{}`", run.command);
    let _ = writeln!(md, "- commit: {}", run.commit);
    let _ = writeln!(md, "- machine: {}", run.machine);
    let _ = writeln!(md, "- Kubernetes: {}", run.kubernetes);
    let _ = writeln!(
        md,
        "- load average before / after: {} / {}",
        run.load_before, run.load_after
    );
    let _ = writeln!(
        md,
        "- CPUs: {}",
        if run.pinned {
            "kube-apiserver and etcd on CPU 0; the agents, the fake runtimes and the bench on CPU 1"
        } else {
            "not pinned (one CPU)"
        }
    );
    let _ = writeln!(
        md,
        "- idle window {:.0} s; outage: kube-apiserver SIGKILLed, restarted after {:.0} s",
        run.idle.as_secs_f64(),
        run.outage.as_secs_f64()
    );
    let _ = writeln!(md, "- plot: `{stem}.png`");
    for failure in &run.failures {
        let _ = writeln!(md, "- **FAILED**: {failure}");
    }
    let _ = writeln!(md, "\n## Scale\n");
    let _ = writeln!(
        md,
        "| agents | idle requests / s (per agent) | idle API server CPU / RSS | idle agents CPU / RSS | outage: attempts / agent / s, most agents in one second once all had seen it | return: peak requests / s (second) | every agent synced after | most lists of one object | 429s |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
    for r in results {
        let _ = writeln!(
            md,
            "| {} | {:.2} ({:.4}) | {:.1} % / {:.0} MiB | {:.1} % / {:.0} MiB | {:.2}, {} ({:.0} %) | {} ({}) | {} | {} | {} |",
            r.agents,
            r.idle.requests_per_second,
            r.idle.requests_per_second_per_agent,
            r.idle.apiserver_cpu_percent,
            r.idle.apiserver_rss_mib,
            r.idle.agents_cpu_percent,
            r.idle.agents_rss_mib,
            r.outage.attempts_per_agent_per_second,
            r.outage.max_agents_after_detection,
            share(r.outage.max_agents_after_detection, r.agents) * 100.0,
            r.back.peak,
            r.back.peak_second,
            r.back.synced_s.map_or("—".into(), |s| format!(
                "{:.1} s ({} of {})",
                s.max, r.back.synced, r.agents
            )),
            r.back.max_lists_per_object,
            r.back.http_429,
        );
    }
    for r in results {
        size_section(&mut md, r);
    }
    md
}

fn share(part: usize, whole: usize) -> f64 {
    part as f64 / whole.max(1) as f64
}

fn size_section(md: &mut String, r: &SizeResult) {
    let n = r.agents;
    let _ = writeln!(md, "\n## {n} agents\n");
    let _ = writeln!(md, "| figure | measured | target |");
    let _ = writeln!(md, "|---|---|---|");
    let mut row = |what: &str, measured: String, target: String| {
        let _ = writeln!(md, "| {what} | {measured} | {target} |");
    };
    row(
        "idle: API requests / s, whole fleet",
        format!(
            "**{:.2}** ({:.0} in {:.0} s)",
            r.idle.requests_per_second,
            r.idle.requests.values().sum::<u64>(),
            r.idle.window_s
        ),
        "—".into(),
    );
    row(
        "idle: API requests / s per agent",
        format!("**{:.4}**", r.idle.requests_per_second_per_agent),
        format!("≤ 0.1: {}", verdict(r.idle.requests_per_second_per_agent <= 0.1)),
    );
    row(
        "idle: by kind, per second",
        kinds_text(&r.idle.requests, r.idle.window_s),
        "—".into(),
    );
    row(
        "idle: new connections to the API server",
        r.idle.connections_opened.to_string(),
        "—".into(),
    );
    row(
        "idle: kube-apiserver CPU (of one core) / RSS",
        format!(
            "{:.2} % / {:.0} MiB",
            r.idle.apiserver_cpu_percent, r.idle.apiserver_rss_mib
        ),
        "—".into(),
    );
    row(
        "idle: all agents' CPU (of one core) / RSS, per agent",
        format!(
            "{:.2} % / {:.0} MiB; {:.3} % / {:.1} MiB",
            r.idle.agents_cpu_percent,
            r.idle.agents_rss_mib,
            r.idle.agents_cpu_percent / n as f64,
            r.idle.agents_rss_mib / n as f64
        ),
        "—".into(),
    );
    let most = r.outage.max_agents_in_a_second();
    row(
        "outage: connection attempts while down",
        format!(
            "{} in {:.1} s: **{:.2}** per agent per second",
            r.outage.attempts, r.outage.down_s, r.outage.attempts_per_agent_per_second
        ),
        format!("≤ 1: {}", verdict(r.outage.attempts_per_agent_per_second <= 1.0)),
    );
    row(
        "outage: agents that found the API unreachable, after the kill",
        summary_text(r.outage.detection_s, r.outage.detected, n),
        "—".into(),
    );
    let after = r.outage.max_agents_after_detection;
    row(
        "outage: most agents trying in one second, once all had found it unreachable",
        format!("**{after}** of {n} ({:.0} %)", share(after, n) * 100.0),
        format!("≤ a third: {}", verdict(share(after, n) <= 1.0 / 3.0)),
    );
    row(
        "outage: most agents trying in one second, the detection included",
        format!("{most} of {n} ({:.0} %)", share(most, n) * 100.0),
        "—".into(),
    );
    row(
        "outage: attempts in each second",
        series(&r.outage.attempts_per_second),
        "—".into(),
    );
    row(
        "outage: agents that activated their checkpoints, after the kill",
        summary_text(r.outage.activation_s, r.outage.activated, n),
        "—".into(),
    );
    row(
        "return: the restarted server's first answer to the fleet, before its first `/readyz` 200",
        format!("{:.1} s", r.back.answered_before_ready_s),
        "—".into(),
    );
    row(
        "return: requests / s, peak (its second after that first answer)",
        format!("**{}** (second {})", r.back.peak, r.back.peak_second),
        "explained".into(),
    );
    row(
        "return: the peak second's requests",
        kinds_text(&r.back.peak_kinds, 1.0),
        "—".into(),
    );
    row(
        "return: requests in each second of the first minute (from the first answer)",
        series(&r.back.per_second),
        "—".into(),
    );
    row(
        "return: the first minute's requests",
        kinds_text(&r.back.kinds, 1.0),
        "—".into(),
    );
    row(
        "return: every agent synced again, after the first `/readyz` 200",
        summary_text(r.back.synced_s, r.back.synced, n),
        format!(
            "≤ 30 s at 200: {}",
            verdict(r.back.synced == n && r.back.synced_s.is_some_and(|s| s.max <= 30.0))
        ),
    );
    row(
        "return: every agent retired its checkpoints",
        summary_text(r.back.deactivated_s, r.back.deactivated, n),
        "—".into(),
    );
    row(
        "return: lists per watched object (one agent's), from the kill on",
        format!(
            "{} lists of {} objects; most of one **{}**; {} listed more than twice",
            r.back.lists,
            r.back.objects_listed,
            r.back.max_lists_per_object,
            r.back.objects_listed_more_than_twice
        ),
        format!("≤ 2: {}", verdict(r.back.max_lists_per_object <= 2)),
    );
    row(
        "return: 403 answers (the authorizer still loading)",
        r.back.http_403.to_string(),
        "—".into(),
    );
    row(
        "return: 429 answers",
        r.back.http_429.to_string(),
        format!("no storm: {}", verdict(r.back.http_429 == 0)),
    );
    row(
        "return: kube-apiserver CPU peak (of one core)",
        format!("{:.0} %", r.back.apiserver_cpu_peak()),
        "—".into(),
    );
    row(
        "return: new connections in each second",
        series(&r.back.connections_per_second),
        "—".into(),
    );
}

/// `3 5 0 …`: a per-second series.
fn series<T: std::fmt::Display>(values: &[T]) -> String {
    if values.is_empty() {
        return "—".into();
    }
    values
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_read_most_first() {
        let check = |kinds: &[(&str, u64)], per: f64, expected: &str| {
            let kinds = kinds.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect();
            assert_eq!(kinds_text(&kinds, per), expected);
        };
        check(&[], 1.0, "none");
        check(
            &[("list pods", 2), ("get /readyz", 5)],
            1.0,
            "get /readyz 5, list pods 2",
        );
        check(&[("get /readyz", 10)], 100.0, "get /readyz 0.100");
    }
}
