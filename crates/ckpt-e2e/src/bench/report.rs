//! The results as JSON (everything, samples included) and as the markdown tables that go
//! into BENCHMARKS.md, side by side with the targets (ARCHITECTURE.md, Targets) and
//! bootkube's numbers measured on the same control plane (BENCHMARKS.md says how).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde_json::{Value, json};

use super::parts::{Idle, Results, Scale};
use super::stats::{Samples, Summary, seconds, summarize};
use super::timing::POLL;
use super::utc::{compact_utc, iso_utc};

/// What identifies a run.
pub(crate) struct Run {
    pub(crate) started_at: SystemTime,
    pub(crate) command: String,
    pub(crate) commit: String,
    pub(crate) machine: String,
    pub(crate) load_before: String,
    pub(crate) load_after: String,
    /// Without the builds.
    pub(crate) duration: Duration,
    pub(crate) reps: usize,
    pub(crate) failures: Vec<String>,
    /// The control plane's release.
    pub(crate) kubernetes: crate::e2e_env::Release,
    /// Which build of the agent ran.
    pub(crate) agent: String,
}

/// The same parts measured with another build of the agent (`--baseline REV`).
pub(crate) struct Baseline {
    /// Its short commit.
    pub(crate) commit: String,
    pub(crate) results: Results,
}

/// One latency row: what, samples, the target, bootkube's number.
struct Row<'a> {
    key: &'static str,
    what: &'static str,
    samples: &'a Samples,
    target: &'static str,
    bootkube: &'static str,
}

fn latency_rows(results: &Results) -> Vec<Row<'_>> {
    vec![
        Row {
            key: "create_to_inactive",
            what: "annotated pod created → inactive checkpoint on disk",
            samples: &results.create_to_inactive,
            target: "< 0.5 s",
            bootkube: "median 3.0 s (1.3–4.5 s; 5 s poll)",
        },
        Row {
            key: "hung_to_active",
            what: "API server hung (SIGSTOP), parent crashed → checkpoint active",
            samples: &results.hung_to_active,
            target: "< 1.5 s (max)",
            bootkube: "never (loop blocked 118 s until resumed)",
        },
        Row {
            key: "killed_to_active",
            what: "API server killed (SIGKILL), parent crashed → checkpoint active",
            samples: &results.killed_to_active,
            target: "< 0.6 s (max)",
            bootkube: "median 2.1 s (0.3–4.8 s)",
        },
        Row {
            key: "running_to_deactivated",
            what: "API server back, parent re-created and running (CRI) → checkpoint deactivated",
            samples: &results.running_to_deactivated,
            target: "< 1 s",
            bootkube: "≤ 5 s (poll)",
        },
        Row {
            key: "removed_immediate",
            what: "parent deleted → checkpoint removed, `immediate`",
            samples: &results.removed_immediate,
            target: "—",
            bootkube: "no such strategy",
        },
        Row {
            key: "removed_grace_2s",
            what: "parent deleted → checkpoint removed, `grace-period` 2 s",
            samples: &results.removed_grace,
            target: "—",
            bootkube: "grace + 5–10 s (10 s grace: median 11.6 s, 10.3–12.9 s)",
        },
    ]
}

/// Writes `dir/e2e-<timestamp>.json` and `.md`; returns their paths.
pub(crate) fn write(
    dir: &Path,
    run: &Run,
    results: &Results,
    baseline: Option<&Baseline>,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let secs = run
        .started_at
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let stem = format!("e2e-{}", compact_utc(secs));
    let json_path = dir.join(format!("{stem}.json"));
    let md_path = dir.join(format!("{stem}.md"));
    let mut json = to_json(run, results, secs);
    let mut md = to_markdown(run, results, secs);
    if let Some(base) = baseline {
        json["baseline"] = json!({
            "commit": base.commit,
            "latencies": latencies_json(&base.results),
            "idle": base.results.idle.as_ref().map(idle_json),
            "scale": base.results.scale.as_ref().map(scale_json),
        });
        md.push_str(&comparison_markdown(&run.commit, results, base));
    }
    fs::write(&json_path, serde_json::to_string_pretty(&json)? + "\n")
        .with_context(|| format!("cannot write {}", json_path.display()))?;
    fs::write(&md_path, md).with_context(|| format!("cannot write {}", md_path.display()))?;
    Ok((json_path, md_path))
}

/// How the figures are taken, on the control plane of `release`.
fn method(release: crate::e2e_env::Release) -> String {
    let cri = match release {
        crate::e2e_env::Release::V1_20 => "v1alpha2",
        crate::e2e_env::Release::V1_34 | crate::e2e_env::Release::V1_37 => "v1",
    };
    format!(
        "Latencies are timed from observable events: a watcher thread, started before the \
action, polls the checkpoint file (or, for \"parent running\", the hollow kubelet's CRI every 10 ms) \
every 5 ms; the latency runs from a mark taken just before the action (the API request from an \
in-process client, the signal to kube-apiserver) to the watcher's first sight. The agent is the \
image's static release build (unless the run names another) at its production log level (`RUST_LOG=info`), one process per part, against \
kube-apiserver {release} + etcd + kubemark's hollow kubelet (fake CRI {cri}) on loopback. API \
requests are counted from the kube-apiserver audit log (the agent's user only); CRI calls and \
kubelet requests through counting proxies the agent is pointed at (HTTP/2 HEADERS frames, HTTP/1 \
header blocks)."
    )
}

fn latencies_json(results: &Results) -> serde_json::Map<String, Value> {
    latency_rows(results)
        .iter()
        .map(|row| {
            let mut entry = row.samples.to_json();
            entry["what"] = json!(row.what);
            entry["target"] = json!(row.target);
            entry["bootkube"] = json!(row.bootkube);
            (row.key.to_owned(), entry)
        })
        .collect()
}

fn to_json(run: &Run, results: &Results, secs: u64) -> Value {
    json!({
        "started_at": iso_utc(secs),
        "command": run.command,
        "commit": run.commit,
        "agent": run.agent,
        "machine": run.machine,
        "load_average": { "before": run.load_before, "after": run.load_after },
        "duration_s": run.duration.as_secs_f64(),
        "reps": run.reps,
        "poll_interval_ms": POLL.as_millis(),
        "kubernetes": run.kubernetes.to_string(),
        "method": method(run.kubernetes),
        "latencies": latencies_json(results),
        "outage_hwm_kib": results.outage_hwm_kib,
        "idle": results.idle.as_ref().map(idle_json),
        "scale": results.scale.as_ref().map(scale_json),
        "failures": run.failures,
    })
}

fn idle_json(idle: &Idle) -> Value {
    let window = idle.window.as_secs_f64();
    let per_minute = |n: u64| n as f64 * 60.0 / window;
    let rss = summarize(&idle.rss_kib);
    json!({
        "window_s": window,
        "rss_kib": { "samples": idle.rss_kib.len(), "min": rss.map(|s| s.min),
                     "median": rss.map(|s| s.median), "max": rss.map(|s| s.max) },
        "hwm_kib_end": idle.after.hwm_kib,
        "rss_anon_kib_end": idle.after.rss_anon_kib,
        "rss_file_kib_end": idle.after.rss_file_kib,
        "api_requests_all_kinds_per_minute": idle.api_requests_all_kinds() as f64 * 60.0 / window,
        "threads": idle.after.threads,
        "cpu_s": idle.cpu_seconds,
        "cpu_percent_of_one_core": idle.cpu_seconds / window * 100.0,
        "cgroup_cpu_s": idle.cgroup_cpu_seconds,
        "cgroup_cpu_percent_of_one_core": idle.cgroup_cpu_seconds.map(|cpu| cpu / window * 100.0),
        "api": idle.api.to_json(window),
        "api_watches": { "opened_in_window": idle.watches.opened, "open_throughout_by_resource": idle.watches.held },
        "cri_calls": idle.cri_calls,
        "cri_calls_per_minute": per_minute(idle.cri_calls),
        "kubelet_requests": idle.kubelet_requests,
        "kubelet_requests_per_minute": per_minute(idle.kubelet_requests),
        "files_watched": idle.files_watched,
        "files_changed": idle.files_changed,
        "storage_write_bytes": idle.after.write_bytes - idle.before.write_bytes,
        "load_average_end": idle.load,
    })
}

fn scale_json(scale: &Scale) -> Value {
    json!({
        "pods": scale.pods,
        "create_s": scale.create.as_secs_f64(),
        "first_create_to_all_checkpointed_s": scale.all_checkpointed.as_secs_f64(),
        "rss_kib_after": scale.after.rss_kib,
        "hwm_kib_after": scale.after.hwm_kib,
        "cpu_s": scale.cpu_seconds,
        "passes": scale.passes.to_json(),
        "pods_the_kubelet_runs": scale.running_on_node,
        "cold_start": scale.cold_start.to_json(),
        "cold_start_rss_kib": scale.cold_start_rss_kib,
        "load_average_end": scale.load,
    })
}

fn to_markdown(run: &Run, results: &Results, secs: u64) -> String {
    let mut md = format!(
        "# pod-checkpointer end-to-end benchmark, {}\n\n\
         - command: `{}`\n- commit: {}\n- agent: {}\n- machine: {}\n\
         - load average (1/5/15 min): {} before, {} after\n\
         - run time: {} (builds excluded)\n",
        iso_utc(secs),
        run.command,
        run.commit,
        run.agent,
        run.machine,
        run.load_before,
        run.load_after,
        human(run.duration),
    );
    if !run.failures.is_empty() {
        md.push_str(&format!("- **failed parts**: {}\n", run.failures.join("; ")));
    }
    md.push_str(&format!("\n{}\n\n## Latency\n\n", method(run.kubernetes)));
    md.push_str("| what | n | min | median | max | target | bootkube (measured here) |\n");
    md.push_str("|---|---|---|---|---|---|---|\n");
    for row in latency_rows(results) {
        let cells = match row.samples.summary() {
            Some(Summary { n, min, median, max }) => {
                format!("{n} | {} | {} | {}", seconds(min), seconds(median), seconds(max))
            }
            None => "0 | — | — | —".into(),
        };
        md.push_str(&format!(
            "| {} | {cells} | {} | {} |\n",
            row.what, row.target, row.bootkube
        ));
    }
    if let Some(hwm) = results.outage_hwm_kib {
        md.push_str(&format!(
            "\nThe outage part's agent peaked at {:.1} MiB resident (VmHWM after its {} \
             outages, each an activation and a deactivation): room a `--memory-limit` must leave.\n",
            hwm as f64 / 1024.0,
            results.running_to_deactivated.summary().map_or(0, |s| s.n)
        ));
    }
    if let Some(idle) = &results.idle {
        md.push_str(&idle_markdown(idle));
    }
    if let Some(scale) = &results.scale {
        md.push_str(&scale_markdown(scale));
    }
    md
}

/// The build under test beside the baseline: every latency row measured in either, and
/// the idle figures the targets name.
fn comparison_markdown(commit: &str, results: &Results, base: &Baseline) -> String {
    let mut md = format!(
        "\n## Beside the baseline {} (same plane, same run, measured after this build)\n\n\
         | what | this build ({commit}) | baseline ({}) | target |\n|---|---|---|---|\n",
        base.commit, base.commit
    );
    let latency = |samples: &super::stats::Samples| {
        samples.summary().map_or("—".into(), |s| {
            format!("median {}, max {} (n={})", seconds(s.median), seconds(s.max), s.n)
        })
    };
    for (row, base_row) in latency_rows(results).iter().zip(latency_rows(&base.results)) {
        if row.samples.summary().is_none() && base_row.samples.summary().is_none() {
            continue;
        }
        md.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            row.what,
            latency(row.samples),
            latency(base_row.samples),
            row.target
        ));
    }
    if let (Some(idle), Some(base_idle)) = (&results.idle, &base.results.idle) {
        for (what, figure, target) in idle_figures() {
            md.push_str(&format!(
                "| idle: {what} | {} | {} | {target} |\n",
                figure(idle),
                figure(base_idle)
            ));
        }
    }
    md
}

type IdleFigure = fn(&Idle) -> String;

/// The idle figures the targets name, for the comparison table.
fn idle_figures() -> [(&'static str, IdleFigure, &'static str); 7] {
    fn per_minute(idle: &Idle, n: u64) -> String {
        format!("{:.1} / min", n as f64 * 60.0 / idle.window.as_secs_f64())
    }
    [
        (
            "VmRSS median",
            |idle| summarize(&idle.rss_kib).map_or("—".into(), |s| format!("{:.1} MiB", s.median / 1024.0)),
            "≤ 10 MiB",
        ),
        (
            "RssAnon + RssFile at the end",
            |idle| {
                format!(
                    "{:.1} + {:.1} MiB",
                    idle.after.rss_anon_kib as f64 / 1024.0,
                    idle.after.rss_file_kib as f64 / 1024.0
                )
            },
            "",
        ),
        (
            "CPU",
            |idle| {
                let percent = |cpu: f64| cpu / idle.window.as_secs_f64() * 100.0;
                match idle.cgroup_cpu_seconds {
                    Some(cpu) => format!(
                        "{:.4} % of one core ({:.3} % in ticks)",
                        percent(cpu),
                        percent(idle.cpu_seconds)
                    ),
                    None => format!("{:.3} % of one core", percent(idle.cpu_seconds)),
                }
            },
            "≤ 0.05 %",
        ),
        (
            "API requests, all kinds",
            |idle| per_minute(idle, idle.api_requests_all_kinds()),
            "≤ 6 / min",
        ),
        (
            "of which GET /readyz",
            |idle| per_minute(idle, idle.api.probes),
            "",
        ),
        ("CRI calls", |idle| per_minute(idle, idle.cri_calls), "≤ 60 / min"),
        (
            "bytes written to storage",
            |idle| (idle.after.write_bytes - idle.before.write_bytes).to_string(),
            "0",
        ),
    ]
}

fn idle_markdown(idle: &Idle) -> String {
    let window = idle.window.as_secs_f64();
    let rate = |n: u64| format!("{n} ({:.1} / min)", n as f64 * 60.0 / window);
    let mib = |kib: f64| format!("{:.1} MiB", kib / 1024.0);
    let rss = summarize(&idle.rss_kib).map_or("—".into(), |s| {
        format!("{} / {} / {}", mib(s.min), mib(s.median), mib(s.max))
    });
    let verbs: Vec<String> = idle
        .api
        .by_verb
        .iter()
        .map(|(verb, n)| format!("{n} {verb}"))
        .chain((idle.api.other > 0).then(|| format!("{} other", idle.api.other)))
        .collect();
    let verbs = if verbs.is_empty() {
        String::new()
    } else {
        format!(": {}", verbs.join(", "))
    };
    let cpu_percent = idle.cpu_seconds / window * 100.0;
    let open: Vec<String> = idle
        .watches
        .held
        .iter()
        .map(|(resource, n)| format!("{n} on {resource}"))
        .collect();
    let open = if open.is_empty() {
        "none".to_owned()
    } else {
        open.join(", ")
    };
    let files = if idle.files_changed.is_empty() {
        format!("0 of {}", idle.files_watched)
    } else {
        format!(
            "{} of {} ({})",
            idle.files_changed.len(),
            idle.files_watched,
            idle.files_changed.join(", ")
        )
    };
    let rows = [
        (
            format!(
                "VmRSS (min / median / max of {} samples, 1 s apart)",
                idle.rss_kib.len()
            ),
            rss,
            "≤ 10 MiB",
            "29 MB",
        ),
        (
            "VmRSS at the end: RssAnon (heap, stacks) + RssFile (the binary's mapped pages)".into(),
            format!(
                "{} + {}",
                mib(idle.after.rss_anon_kib as f64),
                mib(idle.after.rss_file_kib as f64)
            ),
            "",
            "",
        ),
        (
            "VmHWM at the end; threads".into(),
            format!(
                "{}; {} threads",
                mib(idle.after.hwm_kib as f64),
                idle.after.threads
            ),
            "",
            "5 threads",
        ),
        (
            "CPU (utime + stime, whole 10 ms ticks)".into(),
            format!("{:.2} s = {cpu_percent:.3} % of one core", idle.cpu_seconds),
            "≤ 0.05 %",
            "0.14 %",
        ),
        (
            "CPU to the nanosecond (a cgroup of the agent's own: every thread, exited ones too)".into(),
            idle.cgroup_cpu_seconds.map_or_else(
                || "— (no cgroup could be made)".to_owned(),
                |cpu| format!("{cpu:.4} s = {:.4} % of one core", cpu / window * 100.0),
            ),
            "≤ 0.05 %",
            "",
        ),
        (
            "API requests of all kinds: probes, watches opened, the rest (audit log)".into(),
            rate(idle.api_requests_all_kinds()),
            "≤ 6 / min",
            "14 / min",
        ),
        (
            "API requests besides watches and probes (audit log)".into(),
            format!("{}{verbs}", rate(idle.api.resource_requests())),
            "the Node GET (hourly)",
            "14 / min (12 pod LISTs + Secret/ConfigMap GETs)",
        ),
        (
            "API watches opened in the window; open throughout it (audit log)".into(),
            format!("{}; {open}", rate(idle.watches.opened)),
            "watches allowed",
            "none",
        ),
        (
            "API health probes, GET /readyz (audit log)".into(),
            rate(idle.api.probes),
            "probes allowed",
            "none",
        ),
        (
            "CRI calls (counting proxy)".into(),
            rate(idle.cri_calls),
            "≤ 60 / min",
            "≈ 48 / min",
        ),
        (
            "kubelet requests (counting proxy)".into(),
            rate(idle.kubelet_requests),
            "—",
            "24 / min",
        ),
        (
            "checkpoint files changed in the window".into(),
            files,
            "0 when nothing changed",
            "Secrets/ConfigMaps rewritten every 60 s",
        ),
        (
            "bytes written to storage (/proc/PID/io write_bytes)".into(),
            (idle.after.write_bytes - idle.before.write_bytes).to_string(),
            "",
            "",
        ),
    ];
    let mut md = format!(
        "\n## Idle footprint ({} window; load average at its end {})\n\n\
         One agent looking after its own pod and one parent with a Secret and a ConfigMap, \
         nothing changing.\n\n| what | measured | target | bootkube (measured here) |\n|---|---|---|---|\n",
        human(idle.window),
        idle.load
    );
    for (what, measured, target, bootkube) in rows {
        md.push_str(&format!("| {what} | {measured} | {target} | {bootkube} |\n"));
    }
    md
}

fn scale_markdown(scale: &Scale) -> String {
    let mib = |kib: u64| format!("{:.1} MiB", kib as f64 / 1024.0);
    let cold = scale.cold_start.summary().map_or("—".into(), |s| {
        format!(
            "n = {}: {} / {} / {}",
            s.n,
            seconds(s.min),
            seconds(s.median),
            seconds(s.max)
        )
    });
    let cold_rss: Vec<String> = scale.cold_start_rss_kib.iter().map(|k| mib(*k)).collect();
    let passes = &scale.passes;
    let pass_line = format!(
        "{} passes, mean {}, slowest ≤ {}",
        passes.count,
        passes
            .mean_seconds()
            .map_or("—".into(), |m| format!("{:.1} ms", m * 1000.0)),
        passes
            .max_at_most()
            .map_or("> 10 s or none".into(), |m| format!("{} ms", m * 1000.0))
    );
    let rows = [
        (
            format!(
                "create {} annotated pods (one request after the other)",
                scale.pods
            ),
            human(scale.create),
        ),
        (
            "first create → all inactive checkpoints on disk".into(),
            human(scale.all_checkpointed),
        ),
        (
            "pass duration from the first create until 10 s after the last checkpoint (`/metrics`)".into(),
            pass_line,
        ),
        (
            "VmRSS / VmHWM 10 s after the last checkpoint".into(),
            format!("{} / {}", mib(scale.after.rss_kib), mib(scale.after.hwm_kib)),
        ),
        (
            "CPU over the same time".into(),
            format!("{:.2} s", scale.cpu_seconds),
        ),
        (
            "agent started with the pods there → all checkpointed (fresh dirs; min / median / max)".into(),
            cold,
        ),
        ("VmRSS at that moment".into(), cold_rss.join(", ")),
        (
            "of these pods, the hollow kubelet runs".into(),
            if scale.running_on_node < scale.pods {
                format!(
                    "{} (kubemark's hollow kubelet admits 110 pods; it rejects the rest, which stay in the API as Failed and are \
                     checkpointed all the same: the agent selects parents by annotation and node, not phase)",
                    scale.running_on_node
                )
            } else {
                format!("all {}", scale.running_on_node)
            },
        ),
    ];
    let mut md = format!(
        "\n## Scale: {} annotated pods on the node (load average at the end {})\n\n| what | measured |\n|---|---|\n",
        scale.pods, scale.load
    );
    for (what, measured) in rows {
        md.push_str(&format!("| {what} | {measured} |\n"));
    }
    md
}

fn human(duration: Duration) -> String {
    crate::progress::human_duration(duration)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_markdown_has_a_row_per_latency_with_its_summary() {
        let mut results = Results::default();
        results.create_to_inactive.push(Duration::from_millis(40));
        results.create_to_inactive.push(Duration::from_millis(60));
        let run = Run {
            started_at: UNIX_EPOCH + Duration::from_secs(1_796_229_005),
            command: "cargo xtask bench".into(),
            commit: "abc1234".into(),
            machine: "2 CPUs".into(),
            load_before: "0.1 0.2 0.3".into(),
            load_after: "1.0 0.5 0.3".into(),
            duration: Duration::from_secs(300),
            reps: 2,
            failures: vec![],
            kubernetes: crate::e2e_env::Release::V1_37,
            agent: "static".into(),
        };
        let md = to_markdown(&run, &results, 1_796_229_005);
        assert!(
            md.contains("against kube-apiserver v1.37.2 + etcd + kubemark's hollow kubelet (fake CRI v1)"),
            "{md}"
        );
        assert!(
            md.contains("| annotated pod created → inactive checkpoint on disk | 2 | 40 ms | 50 ms | 60 ms | < 0.5 s |"),
            "{md}"
        );
        assert!(
            md.contains("| parent deleted → checkpoint removed, `immediate` | 0 | — | — | — |"),
            "{md}"
        );
        let json = to_json(&run, &results, 1_796_229_005);
        assert_eq!(json["latencies"]["create_to_inactive"]["n"], 2);
        assert_eq!(json["started_at"], "2026-12-02 16:30:05 UTC");
    }
}
