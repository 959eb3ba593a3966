//! Sanitizing a large pod (20 containers, 30 volumes: secrets, configmaps, projected
//! service-account volumes, host paths) into a checkpoint, as the agent does for every
//! changed parent.

use std::collections::BTreeMap;
use std::hint::black_box;

use ckpt_core::{ApiObjects, SanitizeOptions, Timestamp, sanitize};
use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use serde_json::json;

fn large_pod() -> (Pod, ApiObjects) {
    let mut volumes = Vec::new();
    let mut objects = ApiObjects::default();
    for i in 0..10 {
        volumes.push(json!({"name": format!("secret-{i}"), "secret": {"secretName": format!("s{i}"), "defaultMode": 0o640}}));
        let mut s = Secret::default();
        s.metadata.name = Some(format!("s{i}"));
        s.data = Some(
            (0..5)
                .map(|k| (format!("key{k}"), ByteString(vec![b'x'; 2048])))
                .collect(),
        );
        objects.secrets.insert(format!("s{i}"), s.into());
        volumes.push(json!({"name": format!("config-{i}"), "configMap": {"name": format!("c{i}")}}));
        let mut c = ConfigMap::default();
        c.metadata.name = Some(format!("c{i}"));
        c.data = Some(
            (0..5)
                .map(|k| (format!("file{k}.yaml"), "a: 1\n".repeat(100)))
                .collect::<BTreeMap<_, _>>(),
        );
        objects.config_maps.insert(format!("c{i}"), c.into());
    }
    for i in 0..5 {
        volumes.push(json!({"name": format!("kube-api-access-{i}"), "projected": {"sources": [
            {"serviceAccountToken": {"path": "token"}},
            {"configMap": {"name": "c0", "items": [{"key": "file0.yaml", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}
        ]}}));
        volumes.push(
            json!({"name": format!("host-{i}"), "hostPath": {"path": format!("/etc/kubernetes/pki/{i}")}}),
        );
    }
    let containers: Vec<_> = (0..20)
        .map(|i| {
            json!({
                "name": format!("c{i}"), "image": "registry.k8s.io/kube-apiserver:v1.33.0", "imagePullPolicy": "Always",
                "command": ["kube-apiserver", "--secure-port=6443"],
                "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s1", "key": "key1"}}},
                        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                "envFrom": [{"configMapRef": {"name": "c2"}, "prefix": "CFG_"}],
                "volumeMounts": (0..30).map(|v| json!({"name": volume_name(v), "mountPath": format!("/v/{v}")})).collect::<Vec<_>>()
            })
        })
        .collect();
    let pod = serde_json::from_value(json!({
        "metadata": {"name": "kube-apiserver-abc", "namespace": "kube-system", "uid": "u",
                     "annotations": {"checkpointer.alpha.coreos.com/checkpoint": "true"}},
        "spec": {"containers": containers, "volumes": volumes, "serviceAccountName": "sa", "nodeName": "node-1"}
    }))
    .expect("pod");
    (pod, objects)
}

fn volume_name(v: usize) -> String {
    match v {
        0..=19 if v.is_multiple_of(2) => format!("secret-{}", v / 2),
        0..=19 => format!("config-{}", v / 2),
        20..=24 => format!("kube-api-access-{}", v - 20),
        _ => format!("host-{}", v - 25),
    }
}

fn bench_sanitize(c: &mut Criterion) {
    let (pod, objects) = large_pod();
    let options = SanitizeOptions {
        checkpoint_dir: "/etc/kubernetes".into(),
        checkpointed_at: Timestamp(0),
    };
    let sanitized = sanitize(&pod, &objects, &options).expect("sanitizes");
    assert_eq!(sanitized.checkpoint.dirs.len(), 25);
    c.bench_function("sanitize/20-containers-30-volumes", |b| {
        b.iter(|| {
            let s = sanitize(black_box(&pod), black_box(&objects), &options).expect("sanitizes");
            s.checkpoint.manifest_bytes().len()
        });
    });
}

criterion_group!(benches, bench_sanitize);
criterion_main!(benches);
