//! `promtool`, Prometheus' rule checker and rule unit-test runner, for the test of the
//! alerts `render --prometheus` writes. Taken from Debian's `prometheus` package without
//! installing it (installing would start a Prometheus server): the package is downloaded
//! and `usr/bin/promtool` (a static Go binary) extracted into the cache.

use std::path::PathBuf;
use std::process::Command;

use anyhow::Context;

use crate::apt::Apt;
use crate::command::run_on_terminal;
use crate::e2e_env::cache_root;
use crate::image::target_dir;
use crate::progress::Progress;

const PROGRESS: Progress = Progress::new("promtool");

/// The cached `promtool`, downloaded and extracted on first use.
pub fn promtool() -> anyhow::Result<PathBuf> {
    // Tests of one process ask at once: one fetches, the others then find it cached.
    static FETCH: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _fetching = FETCH.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = cache_root().join("promtool");
    let path = dir.join("promtool");
    if works(&path) {
        return Ok(path);
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let work = tempfile_dir(&dir)?;
    let log = target_dir().join("promtool-apt.log");
    if let Some(parent) = log.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    }
    let mut apt = Apt::new(log, PROGRESS);
    apt.update()?;
    PROGRESS.say("apt-get download prometheus (for its promtool) …");
    run_on_terminal(Apt::command(&["download", "prometheus"]).current_dir(&work))?;
    let deb = std::fs::read_dir(&work)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .context("apt-get download left no .deb")?;
    let unpacked = work.join("unpacked");
    run_on_terminal(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked))?;
    // Into place by rename, so a half-copied binary is never taken for a cached one.
    let staged = dir.join(".promtool.tmp");
    std::fs::copy(unpacked.join("usr/bin/promtool"), &staged)
        .context("the package holds no usr/bin/promtool")?;
    std::fs::rename(&staged, &path)?;
    std::fs::remove_dir_all(&work).ok();
    anyhow::ensure!(works(&path), "{} does not run", path.display());
    PROGRESS.say(&format!("promtool cached at {}", path.display()));
    Ok(path)
}

fn works(path: &std::path::Path) -> bool {
    Command::new(path)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A fresh work directory beside the cache (apt's sandbox user must be able to write it,
/// hence 0777 like apt's own partial dirs; removed afterwards).
fn tempfile_dir(parent: &std::path::Path) -> anyhow::Result<PathBuf> {
    let dir = parent.join(format!("work-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))?;
    Ok(dir)
}

/// Checks which alerts of `rules` (a PrometheusRule's `spec`) fire for a node whose
/// metrics, scraped once at `scraped_at` (`exposition`, Prometheus' text format), stay as
/// they were: fails unless exactly the alerts named in `firing` fire.
///
/// One scrape is a snapshot, so it is held for longer than any rule's `for`, with these
/// meanings: a series ending in `_timestamp_seconds` keeps its distance to the present (a
/// synced agent keeps syncing, a token keeps its remaining life; 0, "never", stays 0),
/// every other series keeps its value (so a counter shows no increase: one scrape has no
/// rate), and `up` is 1 (the scrape succeeded). `labels` are the target labels Prometheus
/// adds (`job`, `node`). Prometheus' own rule engine (`promtool test rules`) decides.
pub fn check_alerts(
    rules: &serde_json::Value,
    exposition: &str,
    scraped_at: std::time::SystemTime,
    labels: &[(&str, &str)],
    firing: &[&str],
) -> anyhow::Result<()> {
    use serde_json::{Value, json};

    let alerts: Vec<&Value> = rules["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .filter(|r| r["alert"].is_string())
        .collect();
    anyhow::ensure!(!alerts.is_empty(), "no alerting rules in {rules}");
    for name in firing {
        anyhow::ensure!(
            alerts.iter().any(|a| a["alert"] == *name),
            "{name} is not one of the rules' alerts"
        );
    }
    let longest_for = alerts
        .iter()
        .map(|a| a["for"].as_str().map_or(Ok(0), minutes))
        .collect::<anyhow::Result<Vec<u64>>>()?
        .into_iter()
        .max()
        .unwrap_or(0);
    // Past the longest `for`, with room for the rule's first evaluation and lookback.
    let eval_minutes = longest_for + 10;
    let samples = eval_minutes + 5;
    let now = scraped_at
        .duration_since(std::time::UNIX_EPOCH)
        .context("the scrape time is before 1970")?
        .as_secs_f64();

    let extra: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
    let mut input = vec![json!({
        "series": series_name("up", "", &extra),
        "values": format!("1x{samples}"),
    })];
    for line in exposition.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, own, value) = parse_sample(line)?;
        let values = if name.ends_with("_timestamp_seconds") && value != 0.0 {
            // Promtool's clock starts at 0: the value at its time t is t - (now - value).
            format!("{}+60x{samples}", value - now)
        } else {
            format!("{value}x{samples}")
        };
        input.push(json!({"series": series_name(name, own, &extra), "values": values}));
    }

    let node = labels
        .iter()
        .find(|(k, _)| *k == "node")
        .map(|(_, v)| *v)
        .context("no node label")?;
    let alert_tests: Vec<Value> = alerts
        .iter()
        .map(|rule| {
            let name = rule["alert"].as_str().unwrap_or_default();
            let expected: Vec<Value> = if firing.contains(&name) {
                vec![json!({
                    "exp_labels": {"node": node, "severity": rule["labels"]["severity"]},
                    "exp_annotations": rule["annotations"],
                })]
            } else {
                Vec::new()
            };
            json!({"eval_time": format!("{eval_minutes}m"), "alertname": name, "exp_alerts": expected})
        })
        .collect();
    let tests = json!({
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": input, "alert_rule_test": alert_tests}],
    });

    static RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let serial = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = target_dir().join(format!("alerts-{}-{serial}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    std::fs::write(dir.join("rules.yaml"), serde_saphyr::to_string(rules)?)?;
    std::fs::write(dir.join("tests.yaml"), serde_saphyr::to_string(&tests)?)?;
    let run = Command::new(promtool()?)
        .args(["test", "rules", "tests.yaml"])
        .current_dir(&dir)
        .output()
        .context("cannot run promtool")?;
    anyhow::ensure!(
        run.status.success(),
        "the alerts that fire are not {firing:?} (inputs in {}):\n{}{}",
        dir.display(),
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}

/// `name{own labels,extra labels}`, as promtool's series notation wants it.
fn series_name(name: &str, own: &str, extra: &[String]) -> String {
    let all: Vec<&str> = (!own.is_empty())
        .then_some(own)
        .into_iter()
        .chain(extra.iter().map(String::as_str))
        .collect();
    format!("{name}{{{}}}", all.join(","))
}

/// One sample line of the text format: its name, its labels (inside the braces, as
/// written) and its value; a trailing timestamp is ignored.
fn parse_sample(line: &str) -> anyhow::Result<(&str, &str, f64)> {
    let (name, own, rest) = match line.find('{') {
        Some(open) => {
            let close = line
                .rfind('}')
                .with_context(|| format!("unclosed labels: {line}"))?;
            (&line[..open], &line[open + 1..close], &line[close + 1..])
        }
        None => {
            let (name, rest) = line
                .split_once(' ')
                .with_context(|| format!("no value: {line}"))?;
            (name, "", rest)
        }
    };
    let value = rest
        .split_whitespace()
        .next()
        .with_context(|| format!("no value: {line}"))?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().with_context(|| format!("bad value in {line}"))?,
    };
    Ok((name, own, value))
}

/// A rule's `for` (`90s`, `15m`, `1h`) in whole minutes, rounded up.
fn minutes(duration: &str) -> anyhow::Result<u64> {
    let split = duration
        .find(|c: char| !c.is_ascii_digit())
        .with_context(|| format!("no unit in {duration:?}"))?;
    let (n, unit) = duration.split_at(split);
    let n: u64 = n.parse().with_context(|| format!("bad duration {duration:?}"))?;
    Ok(match unit {
        "s" => n.div_ceil(60),
        "m" => n,
        "h" => n * 60,
        _ => anyhow::bail!("unit {unit:?} of {duration:?} is not s, m or h"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(line: &str, expected: (&str, &str, f64)) {
        assert_eq!(parse_sample(line).unwrap(), expected, "{line}");
    }

    #[test]
    fn sample_lines() {
        check("up 1", ("up", "", 1.0));
        check(
            r#"pod_checkpointer_checkpoints{state="active"} 2"#,
            ("pod_checkpointer_checkpoints", r#"state="active""#, 2.0),
        );
        check(
            r#"pod_checkpointer_build_info{version="0.1 x"} 1 1700000000"#,
            ("pod_checkpointer_build_info", r#"version="0.1 x""#, 1.0),
        );
        check(
            "process_start_time_seconds 1.7e9",
            ("process_start_time_seconds", "", 1.7e9),
        );
        assert!(parse_sample("no_value").is_err());
        assert!(parse_sample("bad{x=\"1\" 2").is_err());
    }

    #[test]
    fn durations() {
        for (text, expected) in [("90s", 2), ("15m", 15), ("1h", 60)] {
            assert_eq!(minutes(text).unwrap(), expected, "{text}");
        }
        assert!(minutes("15").is_err());
        assert!(minutes("1d").is_err());
    }
}
