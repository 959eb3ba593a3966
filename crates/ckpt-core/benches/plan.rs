//! One pass's cost through `decide` at 10, 100, 1,000 and 5,000 checkpoints: `assess`
//! (which sanitizes and admits every listed parent, as each pass of the agent does) and
//! the planner (target for the planner alone: < 2 ms at 5,000, measured before `plan`
//! became internal). A realistic mix: a synced API view listing most parents, some
//! running, some orphans with pending deadlines, the agent's own checkpoint, a few changed
//! specs.

use std::collections::{BTreeMap, BTreeSet};
use std::hint::black_box;
use std::sync::Arc;

use ckpt_core::{
    ApiObjects, ApiState, CheckpointMeta, ControllerOwner, DecideConfig, DiskCheckpoint, GcDecision,
    GcVerdict, LocalView, NamespaceAllowList, Observation, PersistentState, PodId, SanitizeOptions,
    SelfIdentity, StoredCopy, Timestamp, decide, sanitize,
};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::Pod;

const NOW: Timestamp = Timestamp(1_000_000);

struct World {
    observation: Observation,
    disk: BTreeMap<PodId, DiskCheckpoint>,
    verdicts: BTreeMap<PodId, GcDecision>,
    config: DecideConfig,
}

fn world(n: usize) -> World {
    let owner = ControllerOwner {
        api_version: "apps/v1".into(),
        kind: "DaemonSet".into(),
        name: "ds".into(),
        uid: "u".into(),
    };
    let id = |i: usize| PodId::new("kube-system", format!("pod-{i:05}"));
    let config = DecideConfig {
        allowed: NamespaceAllowList::new(["kube-system"]),
        me: SelfIdentity::new("kube-system", "pod-00000", "node-1").with_owner(Some(ControllerOwner {
            name: "agent".into(),
            ..owner.clone()
        })),
        checkpoint_dir: "/etc/kubernetes".into(),
        grace: std::time::Duration::from_secs(60),
        revisions: Default::default(),
    };
    let pod = |i: usize| -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": id(i).name.to_string(), "namespace": "kube-system", "uid": format!("uid-{i}"),
                "annotations": {"checkpointer.alpha.coreos.com/checkpoint": "true"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds",
                                     "uid": "u", "controller": true}]
            },
            "spec": {"nodeName": "node-1",
                     "containers": [{"name": "c", "image": "registry.example/c:1"}]}
        }))
        .expect("a pod")
    };
    // The content a listed parent's checkpoint has, as the pass would write it.
    let options = SanitizeOptions {
        checkpoint_dir: config.checkpoint_dir.clone(),
        checkpointed_at: NOW,
    };
    let hash = |i: usize| {
        let sanitized = sanitize(&pod(i), &ApiObjects::default(), &options).expect("sanitizes");
        sanitized.checkpoint.spec_hash
    };
    let copy = |i: usize, hash: &str| StoredCopy {
        meta: CheckpointMeta {
            parent: id(i),
            parent_uid: Some(format!("uid-{i}")),
            owner: Some(owner.clone()),
            spec_hash: Some(hash.into()),
            template_generation: None,
            checkpointed_at: None,
            retires_when_ready: false,
        },
        digest: hash.into(),
    };
    let listed = |i: &usize| i % 10 != 3;
    let disk = (0..n)
        .map(|i| {
            // A few parents changed their spec since they were checkpointed.
            let stored = if listed(&i) && i % 50 != 1 {
                hash(i)
            } else {
                "old".to_owned()
            };
            let checkpoint = DiskCheckpoint {
                inactive: Some(copy(i, &stored)),
                active: (i % 5 == 0).then(|| copy(i, &stored)),
            };
            (id(i), checkpoint)
        })
        .collect();
    let pods = (0..n).filter(listed).map(|i| (id(i), Arc::new(pod(i)))).collect();
    let running: BTreeSet<PodId> = (0..n).filter(|i| i % 2 == 0).map(id).collect();
    let verdicts = (0..n)
        .filter(|i| !listed(i))
        .map(|i| {
            (
                id(i),
                GcDecision::new(GcVerdict::RemoveAt(Timestamp(2_000_000)), "grace period"),
            )
        })
        .collect();
    let mut observation = Observation::offline(LocalView::Known {
        running,
        containers: BTreeMap::new(),
        kubelet_parents: BTreeSet::new(),
        restarts: BTreeMap::new(),
    });
    observation.api = ApiState::Synced;
    observation.api_error = None;
    observation.pods = pods;
    World {
        observation,
        disk,
        verdicts,
        config,
    }
}

fn bench_plan(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan");
    for n in [10, 100, 1_000, 5_000] {
        let w = world(n);
        let state = PersistentState::default();
        group.bench_with_input(BenchmarkId::from_parameter(n), &w, |b, w| {
            b.iter(|| {
                let decision = decide(
                    black_box(&w.observation),
                    &w.disk,
                    &state,
                    &w.verdicts,
                    &w.config,
                    NOW,
                );
                (decision.writes.len(), decision.removes.len())
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench_plan);
criterion_main!(benches);
