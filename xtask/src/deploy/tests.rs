//! The rollout judgement (a pure function of the DaemonSet and its pods) and the flags.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSetStatus;
use k8s_openapi::api::core::v1::{PodCondition, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::*;
use crate::render::AgentBinaryArg;

fn daemonset(generation: i64, status: Option<(i64, i32, i32, i32, i32)>) -> DaemonSet {
    DaemonSet {
        metadata: ObjectMeta {
            generation: Some(generation),
            ..ObjectMeta::default()
        },
        status: status.map(|(observed, desired, updated, ready, available)| DaemonSetStatus {
            observed_generation: Some(observed),
            desired_number_scheduled: desired,
            updated_number_scheduled: Some(updated),
            number_ready: ready,
            number_available: Some(available),
            ..DaemonSetStatus::default()
        }),
        ..DaemonSet::default()
    }
}

fn pod(node: &str, generation: i64, ready: bool) -> Pod {
    Pod {
        metadata: ObjectMeta {
            labels: Some(BTreeMap::from([(
                TEMPLATE_GENERATION_LABEL.to_owned(),
                generation.to_string(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.to_owned()),
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..PodCondition::default()
            }]),
            ..PodStatus::default()
        }),
    }
}

fn nodes(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

#[test]
fn a_rollout_not_yet_observed_by_the_controller_is_not_done() {
    // Without a controller-manager (or before it catches up) the status lags the spec.
    for ds in [daemonset(2, None), daemonset(2, Some((1, 3, 3, 3, 3)))] {
        let rollout = rollout(&ds, &[]);
        assert!(!rollout.done);
        assert_eq!(
            rollout.summary,
            "waiting for the DaemonSet controller to observe generation 2"
        );
    }
}

#[test]
fn a_rollout_is_done_when_every_node_runs_an_updated_ready_pod() {
    let pods = [pod("cp-1", 2, true), pod("cp-2", 2, true), pod("cp-3", 1, true)];
    let progressing = rollout(&daemonset(2, Some((2, 3, 2, 3, 3))), &pods);
    assert!(!progressing.done);
    assert_eq!(
        progressing.summary,
        "2/3 node(s) updated, 3/3 ready, 3/3 available"
    );
    assert_eq!(
        progressing.ready_nodes,
        nodes(&["cp-1", "cp-2"]),
        "cp-3 runs the old template"
    );

    let not_ready = rollout(&daemonset(2, Some((2, 3, 3, 2, 2))), &pods);
    assert!(!not_ready.done);

    let done = rollout(
        &daemonset(2, Some((2, 3, 3, 3, 3))),
        &[pod("cp-1", 2, true), pod("cp-2", 2, true), pod("cp-3", 2, true)],
    );
    assert!(done.done);
    assert_eq!(done.ready_nodes, nodes(&["cp-1", "cp-2", "cp-3"]));
}

#[test]
fn unready_and_terminating_pods_do_not_count_for_their_node() {
    let mut terminating = pod("cp-2", 1, true);
    terminating.metadata.deletion_timestamp = Some(Time(Default::default()));
    let rollout = rollout(
        &daemonset(1, Some((1, 3, 3, 1, 1))),
        &[pod("cp-1", 1, true), terminating, pod("cp-3", 1, false)],
    );
    assert_eq!(rollout.ready_nodes, nodes(&["cp-1"]));
}

#[test]
fn no_matching_node_finishes_with_a_hint() {
    let rollout = rollout(&daemonset(1, Some((1, 0, 0, 0, 0))), &[]);
    assert!(rollout.done);
    assert!(rollout.summary.contains("control-plane"), "{}", rollout.summary);
}

#[test]
fn timeouts_parse_as_durations() {
    assert_eq!(parse_timeout("90s"), Ok(Duration::from_secs(90)));
    assert_eq!(parse_timeout("5m"), Ok(Duration::from_secs(300)));
    assert_eq!(parse_timeout("1h"), Ok(Duration::from_secs(3600)));
    assert_eq!(parse_timeout("30"), Ok(Duration::from_secs(30)));
    for bad in ["", "m", "5 m", "1.5m", "5d"] {
        assert!(parse_timeout(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn an_unknown_strategy_fails_before_connecting() {
    let deploy = Deploy {
        manifest: ManifestArgs {
            gc_strategy: "nope".into(),
            ..ManifestArgs::default()
        },
        agent: AgentBinaryArg { agent_binary: None },
        // Never read: the strategy is checked first.
        kubeconfig: Some(PathBuf::from("/nonexistent/kubeconfig")),
        dry_run: false,
        timeout: Duration::from_secs(1),
        no_wait: true,
    };
    let error = deploy.run().unwrap_err().to_string();
    assert!(error.contains("unknown strategy \"nope\""), "{error}");
    assert!(error.contains("owner-reference"), "{error}");
}

/// With `--agent-binary`, the binary's strategies are the ones accepted: a strategy only it
/// has gets past the checks (to the kubeconfig), and one it lacks is refused with its list.
#[test]
fn the_agent_binary_decides_which_strategies_are_known() {
    let dir = tempfile::tempdir().unwrap();
    let agent = crate::render::tests::fake_agent(
        dir.path(),
        "keep-forever  keeps all\ngrace-period  default\n",
        true,
    );
    let deploy = |strategy: &str| Deploy {
        manifest: ManifestArgs {
            gc_strategy: strategy.into(),
            ..ManifestArgs::default()
        },
        agent: AgentBinaryArg {
            agent_binary: Some(agent.clone()),
        },
        kubeconfig: Some(PathBuf::from("/nonexistent/kubeconfig")),
        dry_run: false,
        timeout: Duration::from_secs(1),
        no_wait: true,
    };
    let error = format!("{:#}", deploy("keep-forever").run().unwrap_err());
    assert!(error.contains("/nonexistent/kubeconfig"), "{error}");
    let error = deploy("owner-reference").run().unwrap_err().to_string();
    assert!(
        error.contains("registered strategies: keep-forever, grace-period"),
        "{error}"
    );
}

/// Issue 37: an existing namespace that enforces `baseline` or `restricted` refuses the
/// agent's pods; deploy says so before applying anything, and leaves the label alone.
#[test]
fn pod_security_refusals() {
    let check = |labels: &[(&str, &str)], expected: Option<&str>| {
        let labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let refusal = pod_security_refusal("kube-system", &labels);
        match expected {
            None => assert_eq!(refusal, None, "{labels:?}"),
            Some(level) => {
                let refusal = refusal.expect("refused");
                assert!(refusal.contains(&format!("level \"{level}\"")), "{refusal}");
                assert!(
                    refusal.contains("pod-security.kubernetes.io/enforce=privileged"),
                    "{refusal}"
                );
            }
        }
    };
    check(&[], None);
    check(&[("pod-security.kubernetes.io/enforce", "privileged")], None);
    check(&[("pod-security.kubernetes.io/warn", "restricted")], None);
    check(
        &[("pod-security.kubernetes.io/enforce", "baseline")],
        Some("baseline"),
    );
    check(
        &[("pod-security.kubernetes.io/enforce", "restricted")],
        Some("restricted"),
    );
}
