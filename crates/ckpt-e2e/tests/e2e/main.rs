//! The end-to-end suite (issue 7): `pod-checkpointer` as real processes against a real
//! kube-apiserver v1.20.2, etcd and kubemark's hollow kubelet (real kubelet code over a fake
//! CRI runtime), all started by the suite itself.
//!
//! One control plane serves every scenario: only one hollow node can run per machine (its
//! CRI socket path is fixed) and a start takes ~20 s. The scenarios therefore run one after
//! the other, each in a namespace of its own with its own checkpoint dir and lock, and leave
//! the shared static-pod dir clean behind them. A failing scenario does not stop the others:
//! its error names the step it was in, and the tails of its agents' logs are printed (the
//! whole logs are copied to `target/tmp/e2e-logs/`; `E2E_KEEP_LOGS=1` keeps them for passing
//! scenarios too). On the real node that is also the kubelet's, containerd's and every pod's
//! container logs (its `/var/log/pods`).
//!
//! The real-node scenarios (`real_node`, `real_node_seed`) run last, one after the other on
//! one plane and real node (kubelet, containerd and runc in namespaces the suite creates;
//! needs root), with the agent installed from its image by `cargo xtask deploy`. The
//! upgrade under two of the three strategies runs only in the longer mode (`E2E_LONG=1`,
//! `cargo xtask test --long`) or when a filter names it.
//!
//! Run it with `cargo xtask e2e [FILTER…]`, which builds the control plane's binaries and the
//! agent first. Directly: `cargo test -p ckpt-e2e --test e2e -- [--list] [FILTER…]` once
//! `cargo xtask e2e-env build` and `cargo build -p ckpt-bin` have run. A filter selects the
//! scenarios whose name contains it. Nothing is ever skipped: a missing binary or a plane that
//! cannot start fails the run.

mod admission;
mod credentials;
mod drop_in;
mod failover;
mod from_dist;
mod gc;
mod group;
mod install;
mod network;
mod outage;
mod rbac;
mod real_node;
mod real_node_seed;
mod self_gc;
mod self_hosted;
mod suite;
mod three_nodes;
mod three_nodes_cut;
mod three_nodes_faults;
mod three_nodes_upgrades;

use std::panic::{self, AssertUnwindSafe};
use std::process::ExitCode;
use std::time::Instant;

use ckpt_e2e::interrupt;
use ckpt_e2e::progress::human_duration;
use group::GroupScenario;
use real_node::NodeRun;
use suite::{Scenario, ScenarioFn};
use three_nodes::ClusterRun;

/// Every scenario: its name, its namespace and what it does.
const SCENARIOS: &[(&str, &str, ScenarioFn)] = &[
    (
        "api_hung_activates_then_parent_back_deactivates",
        "api-hung",
        outage::api_hung,
    ),
    (
        "api_killed_activates_then_parent_back_deactivates",
        "api-killed",
        outage::api_killed,
    ),
    (
        "api_killed_with_the_cri_off_uses_the_kubelet_pods_api",
        "api-killed-kubelet",
        outage::api_killed_kubelet_only,
    ),
    (
        "network_faults_between_the_agent_and_the_api_server",
        "net-faults",
        network::faults,
    ),
    ("gc_immediate_removes_at_once", "gc-immediate", gc::immediate),
    (
        "gc_grace_period_removes_after_the_period",
        "gc-grace",
        gc::grace_period,
    ),
    (
        "gc_owner_reference_follows_the_daemonset",
        "gc-owner",
        gc::owner_reference,
    ),
    (
        "self_gc_not_on_a_rollout_then_when_deselected",
        "self-gc-deselected",
        self_gc::deselected,
    ),
    (
        "self_gc_after_the_grace_period_when_the_daemonset_is_deleted",
        "self-gc-deleted",
        self_gc::deleted,
    ),
    (
        "credentials_revoked_static_copy_hands_the_lock_over",
        "credentials-revoked",
        credentials::revoked,
    ),
    (
        "rbac_missing_permission_is_a_clear_error",
        "rbac",
        rbac::missing_permission,
    ),
    (
        "admission_agrees_with_the_api_servers_validation",
        "admission",
        admission::agrees_with_the_api_server,
    ),
    (
        "install_render_applies_to_the_api_server",
        "install",
        install::render_applies_to_the_api_server,
    ),
];

/// The real-node scenarios, in order, on one plane and real node started for them once the
/// hollow plane is stopped (see [`real_node::GROUP`]).
const REAL_NODE_SCENARIOS: &[GroupScenario<NodeRun>] = &[
    (
        "real_node_runs_pods_reboots_and_leaves_nothing",
        real_node::runs_pods_and_reboots,
    ),
    (
        "real_node_admission_agrees_with_the_kubelet",
        admission::agrees_with_the_kubelet,
    ),
    (
        "real_node_seed_deploy_power_cut_without_api_then_self_gc",
        real_node_seed::seed,
    ),
    ("real_node_install_from_dist_alone", from_dist::install_from_dist),
    ("real_node_drop_in_under_the_originals_install", drop_in::drop_in),
    (
        "real_node_upgrade_under_grace_period",
        real_node_seed::upgrade_under_grace_period,
    ),
    (
        "real_node_upgrade_under_immediate",
        real_node_seed::upgrade_under_immediate,
    ),
    (
        "real_node_upgrade_under_owner_reference",
        real_node_seed::upgrade_under_owner_reference,
    ),
    // Last: it pivots the plane to a self-hosted one and kills the plane's API server.
    ("real_node_self_hosted_power_cut", self_hosted::power_cut),
];

/// The scenarios on three real nodes (issue 38), on one cluster of their own, after the
/// single real node's (see [`three_nodes::GROUP`]).
const THREE_NODE_SCENARIOS: &[GroupScenario<ClusterRun>] = &[
    (
        "three_nodes_start_power_cut_one_and_back",
        three_nodes::start_cut_one_and_back,
    ),
    // From here on: the first of these pivots to the self-hosted control plane (the plane's
    // own API server stops for good), the others use it.
    (
        "three_nodes_self_hosted_full_power_cut",
        three_nodes_cut::full_power_cut,
    ),
    (
        "three_nodes_self_hosted_rolling_power_cut",
        three_nodes_faults::rolling_power_cut,
    ),
    ("three_nodes_self_hosted_partition", three_nodes_faults::partition),
    (
        "three_nodes_self_hosted_apiserver_upgrades",
        three_nodes_upgrades::apiserver_upgrades,
    ),
    (
        "three_nodes_self_hosted_agent_upgrade",
        three_nodes_upgrades::agent_upgrade,
    ),
];

/// Scenarios that run only in the longer mode (`cargo xtask test --long`, which sets
/// [`LONG_ENV`]): the upgrade under the strategies CI does not cover.
const LONG_ONLY: &[&str] = &[
    "real_node_upgrade_under_immediate",
    "real_node_upgrade_under_owner_reference",
    "three_nodes_self_hosted_rolling_power_cut",
    "three_nodes_self_hosted_partition",
    "three_nodes_self_hosted_apiserver_upgrades",
    "three_nodes_self_hosted_agent_upgrade",
];

/// Set to `1` for the longer mode.
const LONG_ENV: &str = "E2E_LONG";

/// Whether this is the longer mode.
pub(crate) fn long_mode() -> bool {
    std::env::var(LONG_ENV).is_ok_and(|v| v == "1")
}

/// Set to `1` by `cargo xtask demo --self-hosted`: the self-hosted scenario runs one plain
/// power cut and narrates it.
const DEMO_ENV: &str = "E2E_DEMO";

/// Whether this run is the self-hosted demo.
pub(crate) fn demo_mode() -> bool {
    std::env::var(DEMO_ENV).is_ok_and(|v| v == "1")
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        let names = SCENARIOS
            .iter()
            .map(|(name, _, _)| name)
            .chain(REAL_NODE_SCENARIOS.iter().map(|(name, _)| name))
            .chain(THREE_NODE_SCENARIOS.iter().map(|(name, _)| name));
        for name in names {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    // libtest's flags (--nocapture, --test-threads …) mean nothing here: output is never
    // captured and scenarios always run one at a time.
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let long = long_mode();
    // A filter names what to run, long-only scenarios too; without one, the mode decides.
    let wanted = |name: &str| {
        if filters.is_empty() {
            long || !LONG_ONLY.contains(&name)
        } else {
            filters.iter().any(|f| name.contains(f.as_str()))
        }
    };
    let selected: Vec<_> = SCENARIOS.iter().filter(|(name, _, _)| wanted(name)).collect();
    let selected_real: Vec<_> = REAL_NODE_SCENARIOS
        .iter()
        .filter(|(name, _)| wanted(name))
        .collect();
    let selected_three: Vec<_> = THREE_NODE_SCENARIOS
        .iter()
        .filter(|(name, _)| wanted(name))
        .collect();
    if selected.is_empty() && selected_real.is_empty() && selected_three.is_empty() {
        eprintln!("e2e: no scenario matches {filters:?}; `--list` shows them");
        return ExitCode::FAILURE;
    }
    if let Err(e) = interrupt::install() {
        eprintln!("e2e: cannot install the Ctrl-C handler: {e:#}");
    }

    let started = Instant::now();
    let mut failed = if selected.is_empty() {
        Vec::new()
    } else {
        run_hollow_node_scenarios(&selected)
    };
    if !selected_real.is_empty() {
        if interrupt::requested() {
            failed.extend(selected_real.iter().map(|(n, _)| *n));
        } else {
            failed.extend(real_node::GROUP.run(&selected_real));
        }
    }
    if !selected_three.is_empty() {
        if interrupt::requested() {
            failed.extend(selected_three.iter().map(|(n, _)| *n));
        } else {
            failed.extend(three_nodes::GROUP.run(&selected_three));
        }
    }

    // Each real-node group's stop check counts as one more.
    let total = selected.len()
        + selected_real.len()
        + usize::from(!selected_real.is_empty())
        + selected_three.len()
        + usize::from(!selected_three.is_empty());
    let passed = total.saturating_sub(failed.len());
    eprintln!(
        "\ne2e: finished in {}{}",
        human_duration(started.elapsed()),
        if failed.is_empty() {
            String::new()
        } else {
            format!("; failed: {}", failed.join(", "))
        }
    );
    let digest = std::mem::take(&mut *DIGEST.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    if !digest.is_empty() {
        eprintln!("e2e: why, in short (the full reports are above):");
        for line in digest {
            eprintln!("  {line}");
        }
    }
    println!("e2e: {passed} passed, {} failed", failed.len());
    let ran = (selected.iter().map(|(name, _, _)| *name))
        .chain(selected_real.iter().map(|(name, _)| *name))
        .chain(selected_three.iter().map(|(name, _)| *name));
    if let Err(e) = write_results(ran, &failed) {
        eprintln!("e2e: cannot write the results: {e:#}");
    }
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// What the end of the run repeats about each failure, so that the last lines of a CI log
/// say why (the full reports, log tails and all, scroll away above them).
static DIGEST: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Adds a line to the failures' digest; a long line is cut.
pub(crate) fn remember_failure(line: &str) {
    const MAX: usize = 400;
    let mut cut: String = line.chars().take(MAX).collect();
    if cut.len() < line.len() {
        cut.push('…');
    }
    DIGEST
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(cut);
}

/// Where `cargo xtask e2e` wants the run's results (docs/compatibility.md is made from them).
const RESULTS_ENV: &str = "E2E_RESULTS_FILE";

/// Writes what ran and how it went to [`RESULTS_ENV`], if set: the release, when, and each
/// scenario's outcome.
fn write_results<'a>(ran: impl Iterator<Item = &'a str>, failed: &[&str]) -> anyhow::Result<()> {
    let Some(path) = std::env::var_os(RESULTS_ENV).filter(|p| !p.is_empty()) else {
        return Ok(());
    };
    let release = ckpt_e2e::e2e_env::Release::from_env()?;
    let scenarios: Vec<serde_json::Value> = ran
        .map(|name| serde_json::json!({ "name": name, "passed": !failed.contains(&name) }))
        .collect();
    let results = serde_json::json!({
        "release": release.name(),
        "version": release.to_string(),
        "components": release.components(),
        "finished_at": ckpt_core::Timestamp::now().to_rfc3339(),
        "scenarios": scenarios,
    });
    std::fs::write(&path, format!("{results:#}\n"))?;
    Ok(())
}

/// The hollow-node scenarios on one shared plane; returns the names of those that failed.
fn run_hollow_node_scenarios(selected: &[&(&'static str, &'static str, ScenarioFn)]) -> Vec<&'static str> {
    eprintln!(
        "e2e: {} scenario(s) on a hollow node; starting the control plane",
        selected.len()
    );
    let mut suite = match suite::start() {
        Ok(suite) => suite,
        Err(e) => {
            eprintln!("e2e: cannot set up the end-to-end environment: {e:#}");
            remember_failure(&format!("the hollow node's plane: {e:#}"));
            return selected.iter().map(|(name, _, _)| *name).collect();
        }
    };

    let mut failed = Vec::new();
    for (index, (name, namespace, scenario)) in selected.iter().enumerate() {
        if interrupt::requested() {
            failed.extend(selected[index..].iter().map(|(n, _, _)| *n));
            break;
        }
        eprintln!("\n=== scenario {name} (namespace {namespace})");
        let scenario_started = Instant::now();
        let mut ctx = match Scenario::new(&mut suite, name, namespace) {
            Ok(ctx) => ctx,
            Err(e) => {
                eprintln!("--- {name}: FAILED in set-up: {e:#}");
                remember_failure(&format!("{name}: in set-up: {e:#}"));
                failed.push(*name);
                continue;
            }
        };
        // A panic (a bug in the suite) fails this scenario only; its message is already printed.
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| scenario(&mut ctx)))
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the scenario panicked")));
        let report = ctx.finish(outcome.as_ref().err());
        match (outcome, report) {
            (Ok(()), Ok(())) => eprintln!("--- {name}: ok ({})", human_duration(scenario_started.elapsed())),
            (outcome, report) => {
                if let Err(e) = report {
                    eprintln!("--- {name}: clean-up failed: {e:#}");
                }
                if let Err(e) = &outcome {
                    eprintln!(
                        "--- {name}: FAILED after {}",
                        human_duration(scenario_started.elapsed())
                    );
                    remember_failure(&format!("{name}: {e:#}"));
                }
                failed.push(*name);
            }
        }
        if interrupt::requested() {
            failed.extend(selected[index + 1..].iter().map(|(n, _, _)| *n));
            eprintln!("e2e: interrupted; stopping the control plane");
            break;
        }
        if let Err(e) = suite.recover_apiserver() {
            eprintln!("e2e: the API server cannot be brought back ({e:#}); stopping the run");
            failed.extend(selected[index + 1..].iter().map(|(n, _, _)| *n));
            break;
        }
        if let Err(e) = suite.recover_hollow_node() {
            eprintln!("e2e: the hollow node cannot be brought back ({e:#}); stopping the run");
            failed.extend(selected[index + 1..].iter().map(|(n, _, _)| *n));
            break;
        }
    }
    drop(suite);
    failed
}
