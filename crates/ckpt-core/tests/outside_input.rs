//! The bounded property run over ckpt-core's parsers of outside input (issue 18's fuzzing,
//! the part CI runs; `fuzz/` has the coverage-guided targets for longer runs). Pods are
//! realistic parents with random mutations: any field replaced by a random value (paths
//! with `..`, absolute paths, empty names, odd modes …) or dropped. The checks are in
//! `support/outside_input.rs`, shared with the fuzz targets.

#[path = "support/outside_input.rs"]
mod checks;

use k8s_openapi::api::core::v1::Pod;
use proptest::prelude::*;
use serde_json::{Value, json};

/// Parents that use what sanitization rewrites: Secret, ConfigMap and projected volumes
/// with items and modes, env and envFrom from both, the downward API, host networking
/// with named ports in probes, a service-account token, a hostPath of its own.
fn seeds() -> Vec<Value> {
    vec![
        json!({
            "metadata": { "name": "kube-apiserver-x7k2p", "namespace": "kube-system", "uid": "u1",
                "labels": { "k8s-app": "kube-apiserver" },
                "annotations": { "checkpointer.alpha.coreos.com/checkpoint": "true" },
                "ownerReferences": [{ "apiVersion": "apps/v1", "kind": "DaemonSet", "name": "kube-apiserver",
                    "uid": "ds1", "controller": true }] },
            "spec": {
                "hostNetwork": true,
                "serviceAccountName": "default",
                "containers": [{
                    "name": "kube-apiserver", "image": "k8s.gcr.io/kube-apiserver:v1.20.2",
                    "imagePullPolicy": "Always",
                    "env": [
                        { "name": "ETCD", "valueFrom": { "configMapKeyRef": { "name": "config", "key": "etcd-servers" } } },
                        { "name": "KEY", "valueFrom": { "secretKeyRef": { "name": "certs", "key": "tls.key" } } },
                        { "name": "IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } }
                    ],
                    "envFrom": [{ "configMapRef": { "name": "config" }, "prefix": "CFG_" }, { "secretRef": { "name": "certs" } }],
                    "ports": [{ "name": "https", "containerPort": 6443 }],
                    "livenessProbe": { "httpGet": { "path": "/livez", "port": "https", "scheme": "HTTPS" } },
                    "volumeMounts": [
                        { "name": "certs", "mountPath": "/etc/kubernetes/secrets" },
                        { "name": "bundle", "mountPath": "/etc/bundle" },
                        { "name": "pki", "mountPath": "/etc/pki" },
                        { "name": "token", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount" }
                    ]
                }],
                "volumes": [
                    { "name": "certs", "secret": { "secretName": "certs", "defaultMode": 0o400,
                        "items": [{ "key": "tls.crt", "path": "tls/crt" }, { "key": "tls.key", "path": "tls/key", "mode": 0o600 }] } },
                    { "name": "bundle", "projected": { "sources": [
                        { "secret": { "name": "certs" } },
                        { "configMap": { "name": "config", "items": [{ "key": "blob", "path": "blob" }] } },
                        { "downwardAPI": { "items": [{ "path": "labels", "fieldRef": { "fieldPath": "metadata.labels" } }] } }
                    ] } },
                    { "name": "pki", "hostPath": { "path": "/etc/kubernetes/pki", "type": "Directory" } },
                    { "name": "token", "projected": { "sources": [{ "serviceAccountToken": { "path": "token" } }] } }
                ]
            }
        }),
        json!({
            "metadata": { "name": "kube-scheduler-5d8f9", "namespace": "kube-system", "uid": "u2" },
            "spec": {
                "securityContext": { "runAsUser": 65534, "fsGroup": 65534 },
                "initContainers": [{ "name": "wait", "image": "busybox", "command": ["true"] }],
                "containers": [{
                    "name": "kube-scheduler", "image": "k8s.gcr.io/kube-scheduler:v1.20.2",
                    "ports": [{ "name": "metrics", "containerPort": 10259 }],
                    "readinessProbe": { "tcpSocket": { "port": "metrics" } },
                    "volumeMounts": [{ "name": "kubeconfig", "mountPath": "/etc/kubeconfig", "subPath": "kubeconfig" }]
                }],
                "volumes": [
                    { "name": "kubeconfig", "configMap": { "name": "config", "optional": true } },
                    { "name": "missing", "secret": { "secretName": "absent", "optional": true } },
                    { "name": "scratch", "emptyDir": {} }
                ]
            }
        }),
    ]
}

/// Every path to a value in `value` (object keys and array indexes).
fn paths(value: &Value, at: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    out.push(at.clone());
    let children: Vec<(String, &Value)> = match value {
        Value::Object(map) => map.iter().map(|(k, v)| (k.clone(), v)).collect(),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, v)| (i.to_string(), v))
            .collect(),
        _ => Vec::new(),
    };
    for (key, child) in children {
        at.push(key);
        paths(child, at, out);
        at.pop();
    }
}

fn at_mut<'v>(value: &'v mut Value, path: &[String]) -> Option<&'v mut Value> {
    path.iter().try_fold(value, |v, key| match v {
        Value::Object(map) => map.get_mut(key),
        Value::Array(items) => key.parse::<usize>().ok().and_then(|i| items.get_mut(i)),
        _ => None,
    })
}

/// A random replacement: mostly strings that matter to paths and names, some numbers,
/// and small structures.
fn arb_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        4 => prop::sample::select(vec![
            "", ".", "..", "../..", "/", "/etc/passwd", "a/../b", "..data", "a//b", "tls.crt",
            "certs", "config", "absent", "kube-system", "Always", "https", "-1", "0777",
            "metadata.name", "status.podIP", "x".repeat(300).leak(),
        ])
        .prop_map(|s| Value::String(s.to_owned())),
        2 => "\\PC{0,16}".prop_map(Value::String),
        2 => prop_oneof![Just(-1i64), Just(0), Just(0o777), Just(0o4755), Just(65536), Just(i64::MAX), any::<i64>()]
            .prop_map(|n| json!(n)),
        1 => any::<bool>().prop_map(Value::Bool),
        1 => Just(Value::Null),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            prop::collection::btree_map(
                prop::sample::select(vec![
                    "name",
                    "key",
                    "path",
                    "mode",
                    "items",
                    "secretName",
                    "optional",
                    "prefix"
                ]),
                inner,
                0..3,
            )
            .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())),
        ]
    })
}

/// A seed with up to six mutations: replace the value at a path, or drop it.
fn arb_pod() -> impl Strategy<Value = Value> {
    (
        prop::sample::select(seeds()),
        prop::collection::vec((any::<prop::sample::Index>(), any::<bool>(), arb_value()), 0..6),
    )
        .prop_map(|(mut pod, mutations)| {
            for (index, drop, value) in mutations {
                let mut all = Vec::new();
                paths(&pod, &mut Vec::new(), &mut all);
                let path = index.get(&all).clone();
                let Some((last, parent)) = path.split_last() else {
                    continue;
                };
                match at_mut(&mut pod, parent) {
                    Some(Value::Object(map)) if drop => {
                        map.remove(last);
                    }
                    Some(Value::Array(items)) if drop => {
                        if let Ok(i) = last.parse::<usize>()
                            && i < items.len()
                        {
                            items.remove(i);
                        }
                    }
                    Some(parent) => {
                        if let Some(slot) = at_mut(parent, std::slice::from_ref(last)) {
                            *slot = value;
                        }
                    }
                    None => {}
                }
            }
            pod
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn sanitize_and_admit_keep_their_invariants(pod in arb_pod()) {
        // What k8s-openapi cannot read is not a pod the agent would ever see.
        if let Ok(pod) = serde_json::from_value::<Pod>(pod) {
            checks::check_sanitize(&pod, &checks::api_objects());
            checks::check_admit(&pod);
        }
    }

    #[test]
    fn string_parsers_round_trip(text in prop_oneof![
        "\\PC{0,40}",
        "v?[0-9]{1,3}\\.[0-9]{1,3}(\\.[0-9]{1,3})?[-+a-z0-9.]{0,6}",
        "[a-z/]{0,6}/[A-Za-z]{0,6}/[a-z-]{0,6}/[a-z0-9-]{0,6}",
        "pod-checkpointer( pod=[a-z/-]{0,8})?( node=[a-z0-9=-]{0,8})?( [a-z=]{0,6})?",
        "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{1,9})?(Z|[+-][0-9]{2}:[0-9]{2})",
    ]) {
        checks::check_strings(&text);
    }
}

#[test]
fn the_seeds_are_pods_that_sanitize() {
    for seed in seeds() {
        let pod: Pod = serde_json::from_value(seed).expect("a pod");
        let options = ckpt_core::SanitizeOptions {
            checkpoint_dir: checks::CHECKPOINT_DIR.into(),
            checkpointed_at: ckpt_core::Timestamp(0),
        };
        let sanitized = ckpt_core::sanitize(&pod, &checks::api_objects(), &options);
        assert!(sanitized.is_ok(), "{:?}: {sanitized:?}", pod.metadata.name);
        checks::check_sanitize(&pod, &checks::api_objects());
    }
}

/// The property above means something only if many mutated pods still get through to a
/// checkpoint: count them.
#[test]
fn most_mutated_pods_are_read_and_many_are_checkpointed() {
    use proptest::strategy::ValueTree as _;
    use proptest::test_runner::TestRunner;

    let mut runner = TestRunner::deterministic();
    let strategy = arb_pod();
    let options = ckpt_core::SanitizeOptions {
        checkpoint_dir: checks::CHECKPOINT_DIR.into(),
        checkpointed_at: ckpt_core::Timestamp(0),
    };
    let (mut read, mut checkpointed) = (0, 0);
    let total = 1000;
    for _ in 0..total {
        let value = strategy.new_tree(&mut runner).expect("a pod").current();
        if let Ok(pod) = serde_json::from_value::<Pod>(value) {
            read += 1;
            if ckpt_core::sanitize(&pod, &checks::api_objects(), &options).is_ok() {
                checkpointed += 1;
            }
        }
    }
    eprintln!("{read} of {total} mutated pods read, {checkpointed} checkpointed");
    assert!(
        read * 4 > total,
        "only {read} of {total} mutated pods could be read"
    );
    assert!(
        checkpointed * 6 > total,
        "only {checkpointed} of {total} mutated pods were checkpointed"
    );
}
