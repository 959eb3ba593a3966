//! docs/compatibility.md: which end-to-end scenario last passed on which Kubernetes release,
//! at which commit and when. Made from the runs' own results, never typed by hand: the suite
//! writes what it ran and how it went (`E2E_RESULTS_FILE`), [`record`] merges that into
//! docs/compatibility.json (a scenario's cell is replaced by its latest run on that release)
//! and renders the Markdown from the JSON. Commit both after a run; a test checks that the
//! Markdown is the JSON's rendering.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// The variable the suite reads: where to write its results.
pub(crate) const RESULTS_ENV: &str = "E2E_RESULTS_FILE";

/// What one run of the suite wrote.
#[derive(Debug, Deserialize)]
pub(crate) struct RunResults {
    /// `1.37`.
    release: String,
    /// `v1.37.2`.
    version: String,
    /// What ran with it (etcd, the runtime).
    components: String,
    /// RFC 3339.
    finished_at: String,
    scenarios: Vec<ScenarioResult>,
}

#[derive(Debug, Deserialize)]
struct ScenarioResult {
    name: String,
    passed: bool,
}

/// docs/compatibility.json.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Table {
    /// By release (`1.37`): its version and components.
    releases: BTreeMap<String, ReleaseInfo>,
    /// By scenario, then release.
    scenarios: BTreeMap<String, BTreeMap<String, Cell>>,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct ReleaseInfo {
    version: String,
    components: String,
}

/// A scenario's last run on a release.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Cell {
    passed: bool,
    commit: String,
    /// `YYYY-MM-DD`.
    date: String,
}

impl Table {
    /// Replaces the cells of every scenario `run` ran on its release.
    pub(crate) fn merge(&mut self, run: &RunResults, commit: &str) {
        self.releases.insert(
            run.release.clone(),
            ReleaseInfo {
                version: run.version.clone(),
                components: run.components.clone(),
            },
        );
        let date = run.finished_at.get(..10).unwrap_or(&run.finished_at).to_owned();
        for scenario in &run.scenarios {
            self.scenarios.entry(scenario.name.clone()).or_default().insert(
                run.release.clone(),
                Cell {
                    passed: scenario.passed,
                    commit: commit.to_owned(),
                    date: date.clone(),
                },
            );
        }
    }

    /// The Markdown: a row per scenario under its group, a column per release (newest
    /// first).
    pub(crate) fn render(&self) -> String {
        let mut releases: Vec<(&String, &ReleaseInfo)> = self.releases.iter().collect();
        releases.sort_by_key(|(name, _)| std::cmp::Reverse(minor(name)));
        let mut out = String::from(
            "# Compatibility\n\n\
             Which end-to-end scenario last passed (✓) or failed (✗) on which Kubernetes release, with the \
             commit and the date of that run. Generated from the suite's own results by `cargo xtask e2e` \
             and `cargo xtask test` (`docs/compatibility.json`); commit both files after a run. Do not edit \
             by hand: a test checks this file against the JSON.\n\n",
        );
        for (name, info) in &releases {
            out.push_str(&format!(
                "- **{}** (`--kubernetes {name}`): {}\n",
                info.version, info.components
            ));
        }
        out.push_str("\n| Scenario |");
        for (_, info) in &releases {
            out.push_str(&format!(" {} |", info.version));
        }
        out.push_str("\n|---|");
        out.push_str(&"---|".repeat(releases.len()));
        out.push('\n');
        let mut rows: Vec<(&String, &BTreeMap<String, Cell>)> = self.scenarios.iter().collect();
        rows.sort_by_key(|(name, _)| (group(name), *name));
        let mut last_group = None;
        for (name, cells) in rows {
            let this_group = group(name);
            if last_group != Some(this_group) {
                out.push_str(&format!(
                    "| **{}** |{}\n",
                    this_group.1,
                    " |".repeat(releases.len())
                ));
                last_group = Some(this_group);
            }
            out.push_str(&format!("| `{name}` |"));
            for (release, _) in &releases {
                match cells.get(*release) {
                    Some(cell) => out.push_str(&format!(
                        " {} {} ({}) |",
                        if cell.passed { "✓" } else { "✗" },
                        cell.date,
                        cell.commit
                    )),
                    None => out.push_str(" not run |"),
                }
            }
            out.push('\n');
        }
        out
    }
}

/// `37` for `1.37`, for the column order.
fn minor(release: &str) -> u32 {
    release
        .split('.')
        .nth(1)
        .and_then(|m| m.parse().ok())
        .unwrap_or(0)
}

/// A scenario's group, in table order, by its name.
fn group(scenario: &str) -> (u8, &'static str) {
    if scenario.starts_with("three_nodes") {
        (
            5,
            "HA, 3 nodes: a LAN of real nodes, one etcd member each, self-hosted",
        )
    } else if scenario.starts_with("real_node_self_hosted") {
        (4, "Self-hosted control plane on the real node")
    } else if scenario.starts_with("real_node_upgrade") {
        (3, "The agent's rollout on the real node")
    } else if scenario.starts_with("real_node") {
        (2, "Real node (kubelet, containerd, runc)")
    } else if scenario.starts_with("admission") || scenario.starts_with("install") {
        (1, "Against the API server's own checks")
    } else {
        (0, "Hollow node: the agent's behaviour")
    }
}

fn docs_dir() -> PathBuf {
    ckpt_e2e::project_root().join("docs")
}

fn json_path() -> PathBuf {
    docs_dir().join("compatibility.json")
}

fn markdown_path() -> PathBuf {
    docs_dir().join("compatibility.md")
}

/// The committed table (empty when there is none yet).
pub(crate) fn load(path: &Path) -> anyhow::Result<Table> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text).with_context(|| format!("{} is not a table", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Table::default()),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Merges the results the suite wrote at `results` into docs/compatibility.json and renders
/// docs/compatibility.md; returns the Markdown's path.
pub(crate) fn record(results: &Path, commit: &str) -> anyhow::Result<PathBuf> {
    let text = std::fs::read_to_string(results)
        .with_context(|| format!("the suite wrote no results at {}", results.display()))?;
    let run: RunResults = serde_json::from_str(&text)
        .with_context(|| format!("{} is not the suite's results", results.display()))?;
    let mut table = load(&json_path())?;
    table.merge(&run, commit);
    std::fs::create_dir_all(docs_dir())?;
    std::fs::write(json_path(), format!("{:#}\n", serde_json::to_value(&table)?))
        .with_context(|| format!("cannot write {}", json_path().display()))?;
    std::fs::write(markdown_path(), table.render())
        .with_context(|| format!("cannot write {}", markdown_path().display()))?;
    Ok(markdown_path())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(release: &str, finished_at: &str, scenarios: &[(&str, bool)]) -> RunResults {
        RunResults {
            release: release.into(),
            version: format!("v{release}.2"),
            components: format!("components of {release}"),
            finished_at: finished_at.into(),
            scenarios: scenarios
                .iter()
                .map(|(name, passed)| ScenarioResult {
                    name: (*name).into(),
                    passed: *passed,
                })
                .collect(),
        }
    }

    #[test]
    fn a_run_replaces_only_the_cells_it_ran() {
        let mut table = Table::default();
        table.merge(
            &run(
                "1.20",
                "2026-12-01T10:00:00Z",
                &[("gc_immediate", true), ("real_node_runs_pods", true)],
            ),
            "aaaa111",
        );
        table.merge(
            &run("1.37", "2026-12-06T10:00:00Z", &[("gc_immediate", false)]),
            "bbbb222",
        );
        table.merge(
            &run("1.37", "2026-12-06T11:00:00Z", &[("real_node_runs_pods", true)]),
            "cccc333",
        );
        let md = table.render();
        let lines: Vec<&str> = md.lines().filter(|l| l.starts_with("| ")).collect();
        assert_eq!(
            lines,
            [
                "| Scenario | v1.37.2 | v1.20.2 |",
                "| **Hollow node: the agent's behaviour** | | |",
                "| `gc_immediate` | ✗ 2026-12-06 (bbbb222) | ✓ 2026-12-01 (aaaa111) |",
                "| **Real node (kubelet, containerd, runc)** | | |",
                "| `real_node_runs_pods` | ✓ 2026-12-06 (cccc333) | ✓ 2026-12-01 (aaaa111) |",
            ]
        );
        assert!(md.contains("- **v1.37.2** (`--kubernetes 1.37`): components of 1.37"));
    }

    #[test]
    fn a_scenario_not_run_on_a_release_says_so() {
        let mut table = Table::default();
        table.merge(
            &run("1.37", "2026-12-06T10:00:00Z", &[("admission_x", true)]),
            "c",
        );
        table.merge(&run("1.20", "2026-12-06T10:00:00Z", &[("install_y", true)]), "c");
        let md = table.render();
        assert!(
            md.contains("| `admission_x` | ✓ 2026-12-06 (c) | not run |"),
            "{md}"
        );
    }

    /// The committed Markdown is the committed JSON's rendering: nobody typed it.
    #[test]
    fn the_committed_table_is_generated() {
        let table = load(&json_path()).unwrap();
        if table == Table::default() {
            assert!(!markdown_path().exists(), "a compatibility.md without its JSON");
            return;
        }
        let committed = std::fs::read_to_string(markdown_path()).unwrap();
        assert_eq!(
            committed,
            table.render(),
            "docs/compatibility.md differs from the rendering of docs/compatibility.json"
        );
    }
}
