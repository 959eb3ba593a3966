//! Writing and reading back 1,000 checkpoints (each: a manifest, a Secret with two keys,
//! a ConfigMap with one), as after a node's first pass or a restart.
//!
//! Runs in the system temp dir (fsyncs included, so the numbers reflect the disk);
//! set `CKPT_STORE_BENCH_DIR` to measure another filesystem.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

use ckpt_core::ANNOTATION_CHECKPOINT_OF;
use ckpt_core::{Checkpoint, DataDir, DataFile, DataKind, FileOwner, MaterializedDir, PodId};
use ckpt_store::{Layout, Store};
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

const CHECKPOINTS: usize = 1_000;

fn bench_root() -> PathBuf {
    std::env::var_os("CKPT_STORE_BENCH_DIR").map_or_else(std::env::temp_dir, PathBuf::from)
}

fn checkpoints() -> Vec<Checkpoint> {
    (0..CHECKPOINTS)
        .map(|i| {
            let id = PodId::new(format!("ns-{}", i % 10), format!("pod-{i}"));
            let dir = |kind, name: &str, files: &[(&str, usize)]| MaterializedDir {
                dir: DataDir {
                    kind,
                    namespace: id.namespace.to_string(),
                    pod: id.name.to_string(),
                    name: name.to_owned(),
                },
                files: files
                    .iter()
                    .map(|(path, len)| DataFile {
                        path: (*path).to_owned(),
                        bytes: vec![b'k'; *len],
                        mode: 0o600,
                    })
                    .collect(),
            };
            let manifest = Pod {
                metadata: ObjectMeta {
                    name: Some(id.name.to_string()),
                    namespace: Some(id.namespace.to_string()),
                    annotations: Some(BTreeMap::from([(
                        ANNOTATION_CHECKPOINT_OF.to_owned(),
                        id.name.to_string(),
                    )])),
                    ..Default::default()
                },
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "main".into(),
                        image: Some("registry.k8s.io/kube-apiserver:v1.33.0".into()),
                        command: Some((0..20).map(|n| format!("--flag-{n}=value-{n}")).collect()),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            };
            Checkpoint {
                parent: id.clone(),
                manifest,
                dirs: vec![
                    dir(DataKind::Secret, "tls", &[("tls.crt", 1500), ("tls.key", 1700)]),
                    dir(DataKind::ConfigMap, "config", &[("config.yaml", 400)]),
                ],
                owner: FileOwner::default(),
                manifest_holds_secrets: false,
                spec_hash: format!("hash-{i}"),
            }
        })
        .collect()
}

fn fresh_store() -> (tempfile::TempDir, Store) {
    let tmp = tempfile::tempdir_in(bench_root()).expect("tempdir");
    let layout = Layout::new(tmp.path().join("k8s"), tmp.path().join("k8s/manifests"));
    let store = Store::open(layout).expect("open");
    (tmp, store)
}

fn store_benches(c: &mut Criterion) {
    let all = checkpoints();
    let mut group = c.benchmark_group("store_1000_checkpoints");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(20));

    group.bench_function("write_new", |b| {
        b.iter_batched(
            fresh_store,
            |(tmp, store)| {
                for checkpoint in &all {
                    black_box(store.write_inactive(checkpoint).expect("write"));
                }
                tmp
            },
            BatchSize::PerIteration,
        )
    });

    let (_tmp, store) = fresh_store();
    for checkpoint in &all {
        store.write_inactive(checkpoint).expect("write");
    }
    group.bench_function("rewrite_unchanged", |b| {
        b.iter(|| {
            for checkpoint in &all {
                let summary = store.write_inactive(checkpoint).expect("write");
                assert!(!summary.changed());
            }
        })
    });
    group.bench_function("read_all", |b| {
        b.iter(|| {
            let on_disk = store.read_all().expect("read");
            assert_eq!(on_disk.len(), CHECKPOINTS);
            black_box(on_disk)
        })
    });
    group.bench_function("activate_all_then_deactivate_all", |b| {
        b.iter(|| {
            for checkpoint in &all {
                store.activate(&checkpoint.parent).expect("activate");
            }
            for checkpoint in &all {
                store.deactivate(&checkpoint.parent).expect("deactivate");
            }
        })
    });
    group.finish();
}

criterion_group!(benches, store_benches);
criterion_main!(benches);
