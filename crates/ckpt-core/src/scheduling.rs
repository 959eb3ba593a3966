//! Whether a DaemonSet still targets a node: the DaemonSet controller's rule for a daemon
//! pod that already runs there (`NodeShouldRunDaemonPod`'s `shouldContinueRunning`, the
//! same in Kubernetes 1.20 and current releases), as a pure function.
//!
//! The controller builds the daemon pod from the template, adds the tolerations it gives
//! every daemon pod, and keeps a running pod when the pod's `nodeName` (if set) is the
//! node's, the node matches the `nodeSelector` and the required node affinity, and no
//! taint with effect `NoExecute` is left untolerated (an untolerated `NoSchedule` taint
//! only stops new pods). So a NotReady, unreachable or cordoned node — what a power cut
//! leaves — never counts as descheduled.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, NodeSelectorRequirement, NodeSelectorTerm, PodSpec, Taint, Toleration,
};

/// The tolerations the DaemonSet controller adds to every daemon pod
/// (`AddOrUpdateDaemonPodTolerations`): key, effect.
const DAEMON_TOLERATIONS: &[(&str, &str)] = &[
    ("node.kubernetes.io/not-ready", "NoExecute"),
    ("node.kubernetes.io/unreachable", "NoExecute"),
    ("node.kubernetes.io/disk-pressure", "NoSchedule"),
    ("node.kubernetes.io/memory-pressure", "NoSchedule"),
    ("node.kubernetes.io/pid-pressure", "NoSchedule"),
    ("node.kubernetes.io/unschedulable", "NoSchedule"),
];
/// Added too when the pod uses the host network.
const HOST_NETWORK_TOLERATION: (&str, &str) = ("node.kubernetes.io/network-unavailable", "NoSchedule");

/// Whether a daemon pod made from `template` and running on `node` may continue to run
/// there; `Err` says why not.
pub fn daemon_pod_continues_running(template: &PodSpec, node: &Node) -> Result<(), String> {
    let node_name = node.metadata.name.as_deref().unwrap_or_default();
    if let Some(wanted) = template.node_name.as_deref().filter(|n| !n.is_empty())
        && wanted != node_name
    {
        return Err(format!("the template's nodeName is {wanted}"));
    }
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    for (key, value) in template.node_selector.iter().flatten() {
        if labels.get(key) != Some(value) {
            return Err(format!("the node does not match nodeSelector {key}={value}"));
        }
    }
    let required = (template.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref());
    if let Some(selector) = required
        && !selector
            .node_selector_terms
            .iter()
            .any(|t| term_matches(t, labels, node_name))
    {
        return Err("the node does not match the required node affinity".into());
    }
    let mut tolerations = template.tolerations.clone().unwrap_or_default();
    let host_network = template.host_network == Some(true);
    let added = DAEMON_TOLERATIONS
        .iter()
        .chain(host_network.then_some(&HOST_NETWORK_TOLERATION));
    tolerations.extend(added.map(|(key, effect)| Toleration {
        key: Some((*key).to_owned()),
        operator: Some("Exists".into()),
        effect: Some((*effect).to_owned()),
        ..Toleration::default()
    }));
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_ref());
    let untolerated = taints
        .into_iter()
        .flatten()
        .filter(|taint| taint.effect == "NoExecute")
        .find(|taint| !tolerations.iter().any(|t| tolerates(t, taint)));
    match untolerated {
        Some(taint) => Err(format!(
            "the node has the untolerated NoExecute taint {}",
            taint.key
        )),
        None => Ok(()),
    }
}

/// `Toleration.ToleratesTaint`: an empty effect or key matches any; `Exists` matches any
/// value, `Equal` (or no operator) the same value.
fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or_default();
    let key = toleration.key.as_deref().unwrap_or_default();
    if (!effect.is_empty() && effect != taint.effect) || (!key.is_empty() && key != taint.key) {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or_default() {
        "" | "Equal" => {
            toleration.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default()
        }
        "Exists" => true,
        _ => false,
    }
}

/// A node selector term: every expression on labels and every field expression
/// (`metadata.name` only) must match; a term with neither matches nothing.
fn term_matches(term: &NodeSelectorTerm, labels: &BTreeMap<String, String>, node_name: &str) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    let field_value = |r: &NodeSelectorRequirement| (r.key == "metadata.name").then_some(node_name);
    expressions
        .iter()
        .all(|r| requirement_matches(r, labels.get(&r.key).map(String::as_str)))
        && fields.iter().all(|r| {
            // Only `metadata.name` with In/NotIn is a valid field requirement.
            matches!(r.operator.as_str(), "In" | "NotIn") && requirement_matches(r, field_value(r))
        })
}

fn requirement_matches(requirement: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = requirement.values.as_deref().unwrap_or_default();
    let number = |v: &str| v.parse::<i64>().ok();
    match (requirement.operator.as_str(), value) {
        ("In", Some(v)) => values.iter().any(|x| x == v),
        ("In", None) => false,
        ("NotIn", Some(v)) => !values.iter().any(|x| x == v),
        ("NotIn", None) => true,
        ("Exists", v) => v.is_some(),
        ("DoesNotExist", v) => v.is_none(),
        ("Gt" | "Lt", Some(v)) => {
            let (Some(actual), [bound]) = (number(v), values) else {
                return false;
            };
            let Some(bound) = number(bound) else { return false };
            if requirement.operator == "Gt" {
                actual > bound
            } else {
                actual < bound
            }
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests;
