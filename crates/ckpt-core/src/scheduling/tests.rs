//! Cases from the DaemonSet controller's rules (`NodeShouldRunDaemonPod`,
//! `shouldContinueRunning`): nodeName, nodeSelector, required node affinity (terms ORed,
//! requirements ANDed, `matchFields` on `metadata.name`), taints and the tolerations the
//! controller adds to every daemon pod.

use serde_json::{Value, json};

use super::*;

fn node(labels: Value, taints: Value) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": "node-1", "labels": labels},
        "spec": {"taints": taints},
    }))
    .expect("a valid node")
}

fn template(spec: Value) -> PodSpec {
    let mut spec = spec;
    spec["containers"] = json!([{"name": "c", "image": "i"}]);
    serde_json::from_value(spec).expect("a valid pod spec")
}

fn affinity(terms: Value) -> Value {
    json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}})
}

fn check(template_spec: Value, labels: Value, taints: Value, runs: bool) {
    let outcome = daemon_pod_continues_running(&template(template_spec.clone()), &node(labels, taints));
    assert_eq!(outcome.is_ok(), runs, "{template_spec} → {outcome:?}");
}

#[test]
fn targets() {
    let cp = json!({"node-role.kubernetes.io/control-plane": "", "zone": "a", "cores": "8"});
    let none = json!([]);
    let taint = |key: &str, effect: &str| json!([{"key": key, "effect": effect}]);
    let cases: Vec<(&str, Value, Value, Value, bool)> = vec![
        ("no constraints", json!({}), cp.clone(), none.clone(), true),
        (
            "nodeName is this node",
            json!({"nodeName": "node-1"}),
            cp.clone(),
            none.clone(),
            true,
        ),
        (
            "nodeName is another node",
            json!({"nodeName": "node-2"}),
            cp.clone(),
            none.clone(),
            false,
        ),
        (
            "nodeSelector matches",
            json!({"nodeSelector": {"zone": "a"}}),
            cp.clone(),
            none.clone(),
            true,
        ),
        (
            "nodeSelector value differs",
            json!({"nodeSelector": {"zone": "b"}}),
            cp.clone(),
            none.clone(),
            false,
        ),
        (
            "nodeSelector label missing",
            json!({"nodeSelector": {"gpu": "1"}}),
            cp.clone(),
            none.clone(),
            false,
        ),
        (
            "affinity Exists on the control-plane role",
            json!({"affinity": affinity(json!([{"matchExpressions": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]}]))}),
            cp.clone(),
            none.clone(),
            true,
        ),
        (
            "affinity: terms are ORed",
            json!({"affinity": affinity(json!([
                {"matchExpressions": [{"key": "node-role.kubernetes.io/master", "operator": "Exists"}]},
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}]))}),
            cp.clone(),
            none.clone(),
            true,
        ),
        (
            "affinity: requirements in a term are ANDed",
            json!({"affinity": affinity(json!([{"matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["a"]},
                {"key": "node-role.kubernetes.io/master", "operator": "Exists"}]}]))}),
            cp.clone(),
            none.clone(),
            false,
        ),
        (
            "affinity NotIn and DoesNotExist",
            json!({"affinity": affinity(json!([{"matchExpressions": [
                {"key": "zone", "operator": "NotIn", "values": ["b"]},
                {"key": "gpu", "operator": "DoesNotExist"}]}]))}),
            cp.clone(),
            none.clone(),
            true,
        ),
        (
            "affinity Gt and Lt on a numeric label",
            json!({"affinity": affinity(json!([{"matchExpressions": [
                {"key": "cores", "operator": "Gt", "values": ["4"]},
                {"key": "cores", "operator": "Lt", "values": ["16"]}]}]))}),
            cp.clone(),
            none.clone(),
            true,
        ),
        (
            "affinity Gt on a label that is no number",
            json!({"affinity": affinity(json!([{"matchExpressions": [{"key": "zone", "operator": "Gt", "values": ["1"]}]}]))}),
            cp.clone(),
            none.clone(),
            false,
        ),
        (
            "affinity matchFields on metadata.name",
            json!({"affinity": affinity(json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}]))}),
            cp.clone(),
            none.clone(),
            true,
        ),
        (
            "affinity matchFields naming another node",
            json!({"affinity": affinity(json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-2"]}]}]))}),
            cp.clone(),
            none.clone(),
            false,
        ),
        (
            "an empty term matches nothing",
            json!({"affinity": affinity(json!([{}]))}),
            cp.clone(),
            none.clone(),
            false,
        ),
        // Taints: what a power cut or a maintenance leaves never deschedules.
        (
            "NotReady (NoExecute), tolerated by the controller",
            json!({}),
            cp.clone(),
            taint("node.kubernetes.io/not-ready", "NoExecute"),
            true,
        ),
        (
            "unreachable (NoExecute)",
            json!({}),
            cp.clone(),
            taint("node.kubernetes.io/unreachable", "NoExecute"),
            true,
        ),
        (
            "cordoned (unschedulable)",
            json!({}),
            cp.clone(),
            taint("node.kubernetes.io/unschedulable", "NoSchedule"),
            true,
        ),
        (
            "disk pressure",
            json!({}),
            cp.clone(),
            taint("node.kubernetes.io/disk-pressure", "NoSchedule"),
            true,
        ),
        (
            "an untolerated NoSchedule taint stops new pods only",
            json!({}),
            cp.clone(),
            taint("dedicated", "NoSchedule"),
            true,
        ),
        (
            "an untolerated NoExecute taint evicts",
            json!({}),
            cp.clone(),
            taint("dedicated", "NoExecute"),
            false,
        ),
        (
            "a NoExecute taint tolerated by key (Exists)",
            json!({"tolerations": [{"key": "dedicated", "operator": "Exists"}]}),
            cp.clone(),
            taint("dedicated", "NoExecute"),
            true,
        ),
        (
            "tolerate everything (operator Exists alone)",
            json!({"tolerations": [{"operator": "Exists"}]}),
            cp.clone(),
            taint("dedicated", "NoExecute"),
            true,
        ),
        (
            "Equal needs the same value",
            json!({"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "x", "effect": "NoExecute"}]}),
            cp.clone(),
            json!([{"key": "dedicated", "value": "y", "effect": "NoExecute"}]),
            false,
        ),
        (
            "a toleration for another effect does not count",
            json!({"tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]}),
            cp.clone(),
            taint("dedicated", "NoExecute"),
            false,
        ),
        (
            "network-unavailable is tolerated for host-network pods only; it is NoSchedule anyway",
            json!({"hostNetwork": true}),
            cp.clone(),
            taint("node.kubernetes.io/network-unavailable", "NoSchedule"),
            true,
        ),
    ];
    for (name, spec, labels, taints, runs) in cases {
        eprintln!("case: {name}");
        check(spec, labels, taints, runs);
    }
}
