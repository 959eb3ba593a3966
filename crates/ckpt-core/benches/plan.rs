//! The planner's cost per pass at 10, 100, 1,000 and 5,000 checkpoints (target: < 2 ms
//! at 5,000). A realistic mix: a synced API view listing most parents, some running,
//! some orphans with pending deadlines, the agent's own checkpoint, a few changed specs.

use std::collections::{BTreeMap, BTreeSet};
use std::hint::black_box;

use ckpt_core::{
    ApiParent, ApiView, CheckpointMeta, ControllerOwner, DiskCheckpoint, GcDecision, GcVerdict, LocalView,
    NamespaceAllowList, PersistentState, PlanInputs, PodId, SelfIdentity, SelfScheduling, StoredCopy,
    Timestamp, orphans, plan,
};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

struct World {
    api: ApiView,
    local: LocalView,
    disk: BTreeMap<PodId, DiskCheckpoint>,
    desired: BTreeMap<PodId, String>,
    verdicts: BTreeMap<PodId, GcDecision>,
    state: PersistentState,
    me: SelfIdentity,
}

fn world(n: usize) -> World {
    let owner = ControllerOwner {
        api_version: "apps/v1".into(),
        kind: "DaemonSet".into(),
        name: "ds".into(),
        uid: "u".into(),
    };
    let id = |i: usize| PodId::new("kube-system", format!("pod-{i:05}"));
    let copy = |i: usize, hash: &str| StoredCopy {
        meta: CheckpointMeta {
            parent: id(i),
            parent_uid: Some(format!("uid-{i}")),
            owner: Some(owner.clone()),
            spec_hash: Some(hash.into()),
            checkpointed_at: None,
            retires_when_ready: false,
        },
        digest: hash.into(),
    };
    let disk = (0..n)
        .map(|i| {
            (
                id(i),
                DiskCheckpoint {
                    inactive: Some(copy(i, "h1")),
                    active: (i % 5 == 0).then(|| copy(i, "h1")),
                },
            )
        })
        .collect();
    let parents = (0..n)
        .filter(|i| i % 10 != 3)
        .map(|i| {
            (
                id(i),
                ApiParent {
                    uid: None,
                    owner: Some(owner.clone()),
                    completed: false,
                    retires_when_ready: false,
                },
            )
        })
        .collect();
    let running: BTreeSet<PodId> = (0..n).filter(|i| i % 2 == 0).map(id).collect();
    let desired = (0..n)
        .filter(|i| i % 10 != 3)
        .map(|i| (id(i), if i % 50 == 1 { "h2" } else { "h1" }.to_owned()))
        .collect();
    let verdicts = (0..n)
        .filter(|i| i % 10 == 3)
        .map(|i| {
            (
                id(i),
                GcDecision::new(GcVerdict::RemoveAt(Timestamp(2_000_000)), "grace period"),
            )
        })
        .collect();
    World {
        api: ApiView::Synced { parents },
        local: LocalView::Known {
            running,
            kubelet_parents: BTreeSet::new(),
            restarts: BTreeMap::new(),
        },
        disk,
        desired,
        verdicts,
        state: PersistentState::default(),
        me: SelfIdentity::new("kube-system", "pod-00000", "node-1").with_owner(Some(ControllerOwner {
            name: "agent".into(),
            ..owner
        })),
    }
}

fn bench_plan(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan");
    for n in [10, 100, 1_000, 5_000] {
        let w = world(n);
        let allowed = NamespaceAllowList::new(["kube-system"]);
        let ready = std::collections::BTreeSet::new();
        let terminating = std::collections::BTreeSet::new();
        let revisions = ckpt_core::revisions::RevisionSettings::default();
        let live = std::collections::BTreeSet::new();
        let inputs = PlanInputs {
            api: &w.api,
            local: &w.local,
            disk: &w.disk,
            desired: &w.desired,
            verdicts: &w.verdicts,
            state: &w.state,
            me: &w.me,
            scheduling: &SelfScheduling::Targeted,
            grace: std::time::Duration::from_secs(60),
            allowed: &allowed,
            ready: &ready,
            terminating: &terminating,
            revisions: &revisions,
            live: &live,
        };
        group.bench_with_input(BenchmarkId::from_parameter(n), &inputs, |b, inputs| {
            b.iter(|| {
                let orphans = orphans(black_box(inputs), Timestamp(1_000_000));
                let p = plan(black_box(inputs), Timestamp(1_000_000));
                (orphans.len(), p.writes.len())
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench_plan);
criterion_main!(benches);
