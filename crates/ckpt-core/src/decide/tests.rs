//! `decide` tests: what the pass decides from an observation, beyond the planner's own
//! transition table (plan/tests.rs): which pods are parents, which objects they wait
//! for, refusals, the facts each orphan carries, the learned owner, the next deadline.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Secret};
use serde_json::json;

use super::*;
use crate::checkpoint::CheckpointMeta;
use crate::journal::{RestartsSeen, SpecSince};
use crate::lookups::{
    daemon_set_lookups, local_namespaces_outside, orphan_owners, required_by_namespace, scheduling_lookup,
};
use crate::observation::{ObjectRef, ObjectsView, OwnerStatus, StoredCopy};
use crate::plan::RemovalReason;
use crate::references::{MAX_OBJECTS_PER_POD, MAX_WATCHED_OBJECTS};
use crate::revisions::CRASH_LOOP_RESTARTS;

const NS: &str = "kube-system";
const NOW: Timestamp = Timestamp(1_000_000);

fn id(name: &str) -> PodId {
    PodId::new(NS, name)
}

/// A DaemonSet, or a Job when the name starts with `job-`.
fn owner(name: &str) -> ControllerOwner {
    let job = name.starts_with("job-");
    ControllerOwner {
        api_version: if job { "batch/v1" } else { "apps/v1" }.into(),
        kind: if job { "Job" } else { "DaemonSet" }.into(),
        name: name.into(),
        uid: format!("uid-{name}"),
    }
}

/// A pod on this node: `annotated` opts it in; `ds` names its DaemonSet; `mounts` a
/// secret volume; `pvc` makes it unrepresentable; `sidecar` adds an init container that
/// keeps running (a field kubelets before 1.28 drop); `digit_env` an env var whose name
/// starts with a digit (kubelets before 1.35 refuse it in a static pod); `ended` gives its
/// phase and restart policy.
#[derive(Clone, Copy, Default)]
struct PodSpec<'a> {
    ns: &'a str,
    annotated: bool,
    ds: Option<&'a str>,
    mounts: Option<&'a str>,
    pvc: bool,
    sidecar: bool,
    digit_env: bool,
    ended: Option<(&'a str, &'a str)>,
}

fn pod(name: &str, spec: PodSpec<'_>) -> (PodId, Arc<Pod>) {
    let ns = if spec.ns.is_empty() { NS } else { spec.ns };
    let mut volumes = Vec::new();
    if let Some(secret) = spec.mounts {
        volumes.push(json!({"name": "s", "secret": {"secretName": secret}}));
    }
    if spec.pvc {
        volumes.push(json!({"name": "data", "persistentVolumeClaim": {"claimName": "data"}}));
    }
    let owners: Vec<_> = (spec.ds.map(owner).into_iter())
        .map(|o| json!({"apiVersion": o.api_version, "kind": o.kind, "name": o.name, "uid": o.uid, "controller": true}))
        .collect();
    let annotations = if spec.annotated {
        json!({"checkpointer.alpha.coreos.com/checkpoint": "true"})
    } else {
        json!({})
    };
    let mut value = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"),
                     "annotations": annotations, "ownerReferences": owners},
        "spec": {"nodeName": "node-1", "volumes": volumes,
                 "containers": [{"name": "c", "image": "registry.example/c:1"}]},
    });
    if spec.digit_env {
        value["spec"]["containers"][0]["env"] = json!([{"name": "1ST", "value": "x"}]);
    }
    if spec.sidecar {
        value["spec"]["initContainers"] =
            json!([{"name": "proxy", "image": "registry.example/proxy:1", "restartPolicy": "Always"}]);
    }
    let mut pod: Pod = serde_json::from_value(value).expect("a valid pod");
    if let Some((phase, policy)) = spec.ended {
        pod.status.get_or_insert_default().phase = Some(phase.into());
        if let Some(s) = pod.spec.as_mut() {
            s.restart_policy = Some(policy.into());
        }
    }
    (PodId::new(ns, name), Arc::new(pod))
}

fn parent(name: &str) -> PodSpec<'static> {
    PodSpec {
        annotated: true,
        ..PodSpec::default()
    }
    .named(name)
}

impl PodSpec<'_> {
    /// Pods named `pc-…` belong to the agent's DaemonSet, `api-…` to `kube-apiserver`.
    fn named(mut self, name: &str) -> Self {
        if name.starts_with("pc-") {
            self.ds = Some("pod-checkpointer");
        } else if name.starts_with("api-") {
            self.ds = Some("kube-apiserver");
        }
        self
    }
}

fn stored(name: &str, hash: &str) -> (PodId, DiskCheckpoint) {
    let ds = if name.starts_with("pc-") {
        Some(owner("pod-checkpointer"))
    } else if name.starts_with("api-") {
        Some(owner("kube-apiserver"))
    } else {
        None
    };
    let copy = StoredCopy {
        meta: CheckpointMeta {
            parent: id(name),
            parent_uid: Some(format!("uid-{name}")),
            owner: ds,
            spec_hash: Some(hash.into()),
            template_generation: None,
            checkpointed_at: None,
            retires_when_ready: false,
        },
        digest: hash.into(),
    };
    let disk = DiskCheckpoint {
        inactive: Some(copy),
        active: None,
    };
    (id(name), disk)
}

/// The world a pass observes.
struct World {
    observation: Observation,
    disk: BTreeMap<PodId, DiskCheckpoint>,
    verdicts: BTreeMap<PodId, GcDecision>,
    config: DecideConfig,
}

impl World {
    fn synced(pods: &[(&str, PodSpec<'_>)]) -> Self {
        let mut secrets = ObjectsView::default();
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": "present", "namespace": NS}, "data": {"k": "dg=="}}))
        .expect("a valid secret");
        secrets.objects.secrets.insert("present".into(), secret.into());
        secrets.loading.insert(ObjectRef::secret("loading"));
        secrets
            .failed
            .insert(ObjectRef::secret("forbidden"), "forbidden: needs get".into());
        Self {
            observation: Observation {
                api: ApiState::Synced,
                api_error: None,
                pods: pods.iter().map(|(n, spec)| pod(n, *spec)).collect(),
                unknown_fields: BTreeMap::new(),
                objects: BTreeMap::from([(NS.to_owned(), secrets)]),
                local: LocalView::Known {
                    running: BTreeSet::new(),
                    containers: BTreeMap::new(),
                    kubelet_parents: BTreeSet::new(),
                    restarts: BTreeMap::new(),
                },
                owners: BTreeMap::new(),
                daemon_sets: BTreeMap::new(),
                node: Fetched::NotFetched,
                kubelet: None,
            },
            disk: BTreeMap::new(),
            verdicts: BTreeMap::new(),
            config: DecideConfig {
                allowed: NamespaceAllowList::new([NS]),
                me: SelfIdentity::new(NS, "pc-abc", "node-1"),
                checkpoint_dir: "/etc/kubernetes".into(),
                grace: std::time::Duration::ZERO,
                revisions: Default::default(),
            },
        }
    }

    fn kubelet(mut self, major: u32, minor: u32) -> Self {
        self.observation.kubelet = Some(crate::KubeletVersion::new(major, minor));
        self
    }

    fn allow(mut self, namespace: &str) -> Self {
        let allowed = self.config.allowed.namespaces().chain([namespace]);
        self.config.allowed = NamespaceAllowList::new(allowed.map(str::to_owned).collect::<Vec<_>>());
        self
    }

    /// `--namespaces` set to just this one.
    fn only_allow(mut self, namespace: &str) -> Self {
        self.config.allowed = NamespaceAllowList::new([namespace]);
        self
    }

    fn api(mut self, api: ApiState) -> Self {
        self.observation.api = api;
        self
    }

    fn disk(mut self, entries: &[(&str, &str)]) -> Self {
        self.disk = entries.iter().map(|(n, h)| stored(n, h)).collect();
        self
    }

    fn owner_status(mut self, ds: &str, status: OwnerStatus) -> Self {
        (self.observation.owners).insert(OwnerKey::new(NS, &owner(ds)), status);
        self
    }

    fn verdict(mut self, name: &str, verdict: GcVerdict) -> Self {
        self.verdicts.insert(id(name), GcDecision::new(verdict, "test"));
        self
    }

    fn decide(&self) -> Decision {
        decide(
            &self.observation,
            &self.disk,
            &PersistentState::default(),
            &self.verdicts,
            &self.config,
            NOW,
        )
    }

    /// The spec hash `name`'s checkpoint would have now.
    fn hash_of(&self, name: &str) -> String {
        let decision = self.decide();
        let written = decision.writes.iter().find(|c| c.parent == id(name));
        written.expect("a checkpoint of the pod").spec_hash.clone()
    }
}

/// What a decision says, in names.
#[derive(Debug, Default, PartialEq, Eq)]
struct Expect {
    writes: Vec<String>,
    starts: Vec<String>,
    removes: Vec<String>,
    refused: Vec<String>,
    waiting_for_access: Vec<String>,
    loading: Vec<String>,
}

fn names<'a>(ids: impl IntoIterator<Item = &'a PodId>) -> Vec<String> {
    ids.into_iter().map(|id| id.to_string()).collect()
}

fn check(world: &World, expected: Expect) {
    let d = world.decide();
    let actual = Expect {
        writes: names(d.writes.iter().map(|c| &c.parent)),
        starts: names(&d.starts),
        removes: names(d.removes.iter().map(|r| &r.id)),
        refused: names(d.report.refusals.keys()),
        waiting_for_access: names(d.report.waiting_for_access.keys()),
        loading: names(d.report.loading.keys()),
    };
    assert_eq!(actual, expected);
}

fn list(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| format!("{NS}/{n}")).collect()
}

#[test]
fn which_pods_are_checkpointed() {
    let other_ns = PodSpec {
        ns: "default",
        annotated: true,
        ..PodSpec::default()
    };
    let cases: Vec<(&str, World, Expect)> = vec![
        (
            "an annotated pod is written with its content",
            World::synced(&[("a", parent("a"))]),
            Expect {
                writes: list(&["a"]),
                ..Expect::default()
            },
        ),
        (
            "a pod without the annotation, or outside --namespaces, is no parent",
            World::synced(&[("a", PodSpec::default()), ("b", other_ns)]),
            Expect::default(),
        ),
        (
            "a pod waits for its Secret to load, and for the right to read one",
            World::synced(&[
                (
                    "a",
                    PodSpec {
                        mounts: Some("present"),
                        ..parent("a")
                    },
                ),
                (
                    "b",
                    PodSpec {
                        mounts: Some("loading"),
                        ..parent("b")
                    },
                ),
                (
                    "c",
                    PodSpec {
                        mounts: Some("forbidden"),
                        ..parent("c")
                    },
                ),
                (
                    "d",
                    PodSpec {
                        mounts: Some("unwatched"),
                        ..parent("d")
                    },
                ),
            ]),
            Expect {
                writes: list(&["a"]),
                loading: list(&["b", "d"]),
                waiting_for_access: list(&["c"]),
                ..Expect::default()
            },
        ),
        (
            "an unrepresentable pod is refused, its old checkpoint kept",
            World::synced(&[(
                "a",
                PodSpec {
                    pvc: true,
                    ..parent("a")
                },
            )])
            .disk(&[("a", "h1")]),
            Expect {
                refused: list(&["a"]),
                ..Expect::default()
            },
        ),
        (
            "a checkpoint the node's kubelet would not run is refused, its old checkpoint kept",
            World::synced(&[(
                "a",
                PodSpec {
                    digit_env: true,
                    ..parent("a")
                },
            )])
            .kubelet(1, 20)
            .disk(&[("a", "h1")]),
            Expect {
                refused: list(&["a"]),
                ..Expect::default()
            },
        ),
        (
            "the same parent is written for a kubelet that accepts it",
            World::synced(&[(
                "a",
                PodSpec {
                    digit_env: true,
                    ..parent("a")
                },
            )])
            .kubelet(1, 35)
            .disk(&[("a", "h1")]),
            Expect {
                writes: list(&["a"]),
                ..Expect::default()
            },
        ),
        (
            "a field the kubelet drops (from the parent too) is no refusal",
            World::synced(&[(
                "a",
                PodSpec {
                    sidecar: true,
                    ..parent("a")
                },
            )])
            .kubelet(1, 20)
            .disk(&[("a", "h1")]),
            Expect {
                writes: list(&["a"]),
                ..Expect::default()
            },
        ),
        (
            "nothing is sanitized unless synced; unreachable activates what is stored",
            World::synced(&[("a", parent("a"))])
                .disk(&[("a", "h1")])
                .api(ApiState::Unreachable),
            Expect {
                starts: list(&["a"]),
                ..Expect::default()
            },
        ),
        (
            "reachable, not synced: nothing at all",
            World::synced(&[("a", parent("a"))])
                .disk(&[("b", "h1")])
                .api(ApiState::Reachable),
            Expect::default(),
        ),
        (
            "credentials rejected (even with pods seen): nothing at all, no activation",
            World::synced(&[("a", parent("a"))])
                .disk(&[("b", "h1")])
                .api(ApiState::Unauthorized),
            Expect::default(),
        ),
        (
            "a completed pod is not checkpointed and its checkpoint goes, whatever the strategy",
            World::synced(&[
                (
                    "j",
                    PodSpec {
                        ended: Some(("Succeeded", "Never")),
                        ds: Some("job-migrate"),
                        ..parent("j")
                    },
                ),
                (
                    "k",
                    PodSpec {
                        ended: Some(("Failed", "OnFailure")),
                        ds: Some("job-backup"),
                        ..parent("k")
                    },
                ),
            ])
            .disk(&[("j", "h1"), ("k", "h1")])
            .verdict("j", GcVerdict::Keep),
            Expect {
                removes: list(&["j", "k"]),
                ..Expect::default()
            },
        ),
        (
            "a pod no Job owns that ended (crashed, or stopped and exited 0) is what checkpoints are for",
            World::synced(&[
                (
                    "c",
                    PodSpec {
                        ended: Some(("Failed", "Never")),
                        ..parent("c")
                    },
                ),
                (
                    "d",
                    PodSpec {
                        ended: Some(("Succeeded", "Never")),
                        ..parent("d")
                    },
                ),
            ])
            .disk(&[("c", "h1"), ("d", "h1")]),
            Expect {
                writes: list(&["c", "d"]),
                ..Expect::default()
            },
        ),
        (
            "a failed pod meant to run always (an evicted daemon) stays protected",
            World::synced(&[
                (
                    "e",
                    PodSpec {
                        ended: Some(("Failed", "Always")),
                        ..parent("e")
                    },
                ),
                (
                    "r",
                    PodSpec {
                        ended: Some(("Running", "Never")),
                        ..parent("r")
                    },
                ),
            ]),
            Expect {
                writes: list(&["e", "r"]),
                ..Expect::default()
            },
        ),
        (
            "a namespace removed from --namespaces: its inactive checkpoint goes",
            World::synced(&[])
                .disk(&[("a", "h1")])
                .verdict("a", GcVerdict::Keep)
                .only_allow("other"),
            Expect {
                removes: list(&["a"]),
                ..Expect::default()
            },
        ),
        (
            "an orphan goes when its verdict says so",
            World::synced(&[])
                .disk(&[("a", "h1")])
                .verdict("a", GcVerdict::RemoveNow),
            Expect {
                removes: list(&["a"]),
                ..Expect::default()
            },
        ),
    ];
    for (name, world, expected) in cases {
        eprintln!("case: {name}");
        check(&world, expected);
    }
}

/// The orphans of a world, as (name, owner status, siblings as `name` or `name*` when
/// checkpointed).
fn check_orphans(world: &World, expected: &[(&str, OwnerStatus, &[&str])]) {
    let state = PersistentState::default();
    let assessment = assess(&world.observation, &world.disk, &state, &world.config, NOW);
    let actual: Vec<(String, OwnerStatus, Vec<String>)> = (assessment.orphans().iter())
        .map(|o| {
            let siblings = (o.siblings.iter())
                .map(|s| format!("{}{}", s.id.name, if s.checkpointed { "*" } else { "" }))
                .collect();
            (o.id.name.to_string(), o.owner_status, siblings)
        })
        .collect();
    let expected: Vec<(String, OwnerStatus, Vec<String>)> = (expected.iter())
        .map(|(n, s, sib)| ((*n).to_owned(), *s, sib.iter().map(|x| (*x).to_owned()).collect()))
        .collect();
    assert_eq!(actual, expected);
}

#[test]
fn orphans_carry_their_facts() {
    use OwnerStatus::{Absent, Present, Unknown};
    let current = World::synced(&[("api-new", parent("api-new"))]);
    let new_hash = current.hash_of("api-new");
    let with_new = [("api-old", "h1"), ("api-new", new_hash.as_str())];
    type Case<'a> = (&'a str, World, &'a [(&'a str, OwnerStatus, &'a [&'a str])]);
    let cases: Vec<Case<'_>> = vec![
        (
            "a sibling not yet checkpointed; the owner not looked up",
            World::synced(&[("api-new", parent("api-new"))]).disk(&[("api-old", "h1")]),
            &[("api-old", Unknown, &["api-new"])],
        ),
        (
            "a checkpointed sibling; the owner looked up and present",
            World::synced(&[("api-new", parent("api-new"))])
                .disk(&with_new)
                .owner_status("kube-apiserver", Present),
            &[("api-old", Present, &["api-new*"])],
        ),
        (
            "a sibling that cannot be checkpointed is no sibling",
            World::synced(&[(
                "api-new",
                PodSpec {
                    pvc: true,
                    ..parent("api-new")
                },
            )])
            .disk(&[("api-old", "h1")])
            .owner_status("kube-apiserver", Absent),
            &[("api-old", Absent, &[])],
        ),
        (
            "an unannotated pod of the same owner is no sibling; no owner, no facts",
            World::synced(&[("api-x", PodSpec::default().named("api-x"))])
                .disk(&[("api-old", "h1"), ("b", "h1")]),
            &[("api-old", Unknown, &[]), ("b", Unknown, &[])],
        ),
        (
            "pods of another controller, or of the same-named one in another namespace, are no siblings",
            World::synced(&[
                (
                    "sched-x",
                    PodSpec {
                        ds: Some("kube-scheduler"),
                        ..parent("sched-x")
                    },
                ),
                (
                    "api-y",
                    PodSpec {
                        ns: "default",
                        ..parent("api-y")
                    },
                ),
            ])
            .allow("default")
            .disk(&[("api-old", "h1")]),
            &[("api-old", Unknown, &[])],
        ),
        (
            "no orphans unless synced",
            World::synced(&[])
                .disk(&[("api-old", "h1")])
                .api(ApiState::Reachable),
            &[],
        ),
    ];
    for (name, world, expected) in cases {
        eprintln!("case: {name}");
        check_orphans(&world, expected);
    }
}

#[test]
fn owners_to_look_up_are_those_of_absent_parents() {
    let world = World::synced(&[("api-new", parent("api-new")), ("pc-abc", parent("pc-abc"))]).disk(&[
        ("api-old", "h1"),
        ("api-new", "h1"),
        ("pc-abc", "h1"),
        ("b", "h1"),
    ]);
    let check = |api: ApiState, expected: &[&str]| {
        let wanted = orphan_owners(api, &world.observation.pods, &world.disk, &world.config.allowed);
        let actual: Vec<&str> = wanted.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(actual, expected, "{api:?}");
    };
    check(ApiState::Synced, &["kube-apiserver"]);
    check(ApiState::Reachable, &[]);
    check(ApiState::Unreachable, &[]);
}

#[test]
fn the_agents_owner_is_learned_from_its_pod_or_its_checkpoint() {
    let check = |world: World, expected: Option<&str>| {
        let report = world.decide().report;
        assert_eq!(report.own_owner.map(|o| o.name), expected.map(str::to_owned));
    };
    check(
        World::synced(&[("pc-abc", parent("pc-abc"))]),
        Some("pod-checkpointer"),
    );
    check(
        World::synced(&[]).disk(&[("pc-abc", "h1")]),
        Some("pod-checkpointer"),
    );
    check(World::synced(&[]).disk(&[("api-old", "h1")]), None);
    // Once known it stays known.
    let mut world = World::synced(&[]);
    world.config.me.owner = Some(owner("pod-checkpointer"));
    check(world, Some("pod-checkpointer"));
}

#[test]
fn reports_the_next_deadline_and_event_subjects() {
    let world = World::synced(&[("a", parent("a"))])
        .disk(&[("b", "h1"), ("c", "h1"), ("d", "h1")])
        .verdict("b", GcVerdict::RemoveAt(Timestamp(NOW.0 + 5_000)))
        .verdict("c", GcVerdict::RemoveAt(Timestamp(NOW.0 + 2_000)))
        .verdict("d", GcVerdict::RemoveAt(Timestamp(NOW.0 - 1)));
    let decision = world.decide();
    assert_eq!(decision.report.next_deadline, Some(Timestamp(NOW.0 + 2_000)));
    assert_eq!(names(decision.removes.iter().map(|r| &r.id)), list(&["d"]));
    let subjects: Vec<(String, String)> = (decision.report.parent_uids.iter())
        .map(|(id, uid)| (id.name.to_string(), uid.clone()))
        .collect();
    let expected: Vec<(String, String)> = ["a", "b", "c", "d"]
        .iter()
        .map(|n| ((*n).to_owned(), format!("uid-{n}")))
        .collect();
    assert_eq!(subjects, expected);
    let counts = decision.report.counts_by_state();
    assert_eq!(counts.get("inactive-grace"), Some(&2));
}

#[test]
fn watches_cover_what_parents_need_in_every_allowed_namespace() {
    let world = World::synced(&[
        (
            "a",
            PodSpec {
                mounts: Some("s1"),
                ..parent("a")
            },
        ),
        (
            "b",
            PodSpec {
                mounts: Some("s2"),
                ..PodSpec::default()
            },
        ),
    ]);
    let mut allowed = world.config.allowed.clone();
    allowed = NamespaceAllowList::new(allowed.namespaces().chain(["default"]));
    let required = required_by_namespace(&world.observation.pods, &allowed, &world.config.me);
    let secrets: Vec<(&str, Vec<&str>)> = (required.iter())
        .map(|(ns, r)| (ns.as_str(), r.secrets.iter().map(String::as_str).collect()))
        .collect();
    assert_eq!(secrets, [("default", vec![]), (NS, vec!["s1"])]);
}

/// A parent referencing more objects than the agent watches for one pod is refused, and
/// nothing of it is watched; one at the limit is watched as usual.
#[test]
fn a_pod_referencing_too_many_objects_is_refused_and_not_watched() {
    let many = |n: usize| {
        let (id, pod) = pod("a", parent("a"));
        let mut pod = (*pod).clone();
        let env: Vec<serde_json::Value> = (0..n)
            .map(|i| json!({"name": format!("E{i}"), "valueFrom": {"secretKeyRef": {"name": format!("s{i}"), "key": "k"}}}))
            .collect();
        pod.spec.as_mut().unwrap().containers[0].env = Some(serde_json::from_value(json!(env)).unwrap());
        (id, Arc::new(pod))
    };
    let mut world = World::synced(&[]);
    let (id, pod) = many(MAX_OBJECTS_PER_POD + 1);
    world.observation.pods.insert(id.clone(), pod);
    let d = world.decide();
    let refusal = &d.report.refusals[&id];
    assert_eq!(
        refusal.message,
        format!(
            "references 65 Secrets and ConfigMaps, more than the {MAX_OBJECTS_PER_POD} the agent watches for one pod"
        )
    );
    let watched = required_by_namespace(&world.observation.pods, &world.config.allowed, &world.config.me);
    assert!(watched[NS].is_empty(), "{:?}", watched[NS]);

    let (id, pod) = many(MAX_OBJECTS_PER_POD);
    world.observation.pods.insert(id, pod);
    let watched = required_by_namespace(&world.observation.pods, &world.config.allowed, &world.config.me);
    assert_eq!(watched[NS].len(), MAX_OBJECTS_PER_POD);
}

fn daemon_set(uid: &str, node_selector: serde_json::Value) -> Fetched<k8s_openapi::api::apps::v1::DaemonSet> {
    checkpointed_daemon_set("pod-checkpointer", uid, node_selector, "true")
}

/// A DaemonSet whose pod template has `node_selector` and this value of the checkpoint
/// annotation.
fn checkpointed_daemon_set(
    name: &str,
    uid: &str,
    node_selector: serde_json::Value,
    checkpoint: &str,
) -> Fetched<k8s_openapi::api::apps::v1::DaemonSet> {
    let ds = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS, "uid": uid},
        "spec": {"selector": {}, "template": {
            "metadata": {"annotations": {"checkpointer.alpha.coreos.com/checkpoint": checkpoint}},
            "spec": {"nodeSelector": node_selector, "containers": [{"name": "c", "image": "i"}]}}},
    }))
    .expect("a valid DaemonSet");
    Fetched::Found(Arc::new(ds))
}

fn node(labels: serde_json::Value) -> Fetched<k8s_openapi::api::core::v1::Node> {
    let node = serde_json::from_value(json!({"metadata": {"name": "node-1", "labels": labels}}))
        .expect("a valid node");
    Fetched::Found(Arc::new(node))
}

/// What the facts about the agent's own DaemonSet and this node make of an absent own
/// pod (the planner's rule for each outcome is in plan/tests.rs).
#[test]
fn the_agents_scheduling_comes_from_its_daemon_set_and_the_node() {
    let cp = json!({"node-role.kubernetes.io/control-plane": ""});
    let selector = json!({"node-role.kubernetes.io/control-plane": ""});
    let check =
        |own: Fetched<_>, node: Fetched<_>, on_disk: &str, expected: &str, owner_after: Option<&str>| {
            let mut world = World::synced(&[]).disk(&[(on_disk, "h1")]);
            (world.observation.daemon_sets).insert(OwnerKey::new(NS, &owner("pod-checkpointer")), own);
            world.observation.node = node;
            let report = world.decide().report;
            let scheduling = match report.scheduling {
                Some(SelfScheduling::Targeted) => "targeted".to_owned(),
                Some(SelfScheduling::Deleted) => "deleted".to_owned(),
                Some(SelfScheduling::Descheduled(why)) => format!("descheduled: {why}"),
                Some(SelfScheduling::Unknown(why)) => format!("unknown: {why}"),
                None => "not asked".to_owned(),
            };
            assert!(scheduling.starts_with(expected), "{scheduling}");
            assert_eq!(
                report.own_owner.map(|o| o.uid).as_deref(),
                owner_after,
                "{scheduling}"
            );
        };
    let uid = "uid-pod-checkpointer";
    check(
        daemon_set(uid, selector.clone()),
        node(cp.clone()),
        "pc-abc",
        "targeted",
        Some(uid),
    );
    check(
        daemon_set(uid, json!({"other": "x"})),
        node(cp.clone()),
        "pc-abc",
        "descheduled: its DaemonSet no longer targets",
        Some(uid),
    );
    check(
        Fetched::NotFound,
        node(cp.clone()),
        "pc-abc",
        "deleted",
        Some(uid),
    );
    // Re-created under the same name, targeting the node: its pods are the agent's now.
    check(
        daemon_set("uid-new", selector.clone()),
        node(cp.clone()),
        "pc-abc",
        "targeted",
        Some("uid-new"),
    );
    check(
        daemon_set("uid-new", json!({"other": "x"})),
        node(cp.clone()),
        "pc-abc",
        "descheduled: its DaemonSet was replaced",
        Some(uid),
    );
    // A node that cannot be read is never a descheduling.
    check(
        daemon_set(uid, selector.clone()),
        Fetched::Failed("403".into()),
        "pc-abc",
        "unknown",
        Some(uid),
    );
    check(
        daemon_set(uid, selector.clone()),
        Fetched::NotFound,
        "pc-abc",
        "unknown",
        Some(uid),
    );
    check(
        Fetched::Failed("forbidden".into()),
        node(cp.clone()),
        "pc-abc",
        "unknown: cannot read",
        Some(uid),
    );
    // No checkpoint or pod of the agent: its controller is not known.
    check(
        Fetched::NotFetched,
        Fetched::NotFetched,
        "api-old",
        "unknown: the agent's own controller",
        None,
    );
}

#[test]
fn the_daemon_set_is_looked_up_only_without_the_agents_pod() {
    let world = World::synced(&[]).disk(&[("pc-abc", "h1")]);
    let lookup = |world: &World, api| {
        scheduling_lookup(api, &world.observation.pods, &world.disk, &world.config.me).map(|k| k.name)
    };
    assert_eq!(
        lookup(&world, ApiState::Synced).as_deref(),
        Some("pod-checkpointer")
    );
    assert_eq!(lookup(&world, ApiState::Reachable), None);
    let with_pod = World::synced(&[("pc-abc", parent("pc-abc"))]).disk(&[("pc-abc", "h1")]);
    assert_eq!(lookup(&with_pod, ApiState::Synced), None);
    // A pod that only claims the agent's DaemonSet by kind and name is not the agent's.
    let mut forged = PodSpec::default().named("pc-forged");
    forged.annotated = true;
    let world = World::synced(&[("pc-forged", forged)]).disk(&[("pc-abc", "h1")]);
    let mut pods = world.observation.pods.clone();
    let pod = pods.get_mut(&id("pc-forged")).expect("listed");
    let pod = Arc::make_mut(pod);
    pod.metadata.owner_references.as_mut().expect("owned")[0].uid = "uid-forged".into();
    let forged_world = World {
        observation: Observation {
            pods,
            ..world.observation.clone()
        },
        ..world
    };
    assert_eq!(
        lookup(&forged_world, ApiState::Synced).as_deref(),
        Some("pod-checkpointer")
    );
}

#[test]
fn an_inadmissible_checkpoint_is_refused_naming_the_field_and_the_kubelet() {
    let odd = PodSpec {
        digit_env: true,
        ..parent("a")
    };
    let d = World::synced(&[("a", odd)]).kubelet(1, 20).decide();
    let refusal = &d.report.refusals[&id("a")];
    assert_eq!(
        refusal.message,
        "the kubelet of node-1 (v1.20) would not run the checkpoint as a static pod: \
         spec.containers[0].env[0].name: Invalid value: \"1ST\": not a valid environment variable name"
    );
    assert_eq!(refusal.uid.as_deref(), Some("uid-a"));
}

/// A parent with fields the model does not know (a newer API server) is refused, naming
/// them; the checkpoint on disk stays; the other parents are checkpointed as usual.
#[test]
fn a_pod_with_fields_the_model_does_not_know_is_refused_and_its_checkpoint_kept() {
    let mut world = World::synced(&[("a", parent("a")), ("b", parent("b"))]).disk(&[("a", "h1")]);
    world.observation.unknown_fields.insert(
        id("a"),
        vec!["spec.futureField".into(), "spec.containers[0].futureKnob".into()],
    );
    check(
        &world,
        Expect {
            writes: list(&["b"]),
            refused: list(&["a"]),
            ..Expect::default()
        },
    );
    let d = world.decide();
    let refusal = &d.report.refusals[&id("a")];
    assert_eq!(
        refusal.message,
        "the pod has fields this agent does not know (the API server is newer than its Kubernetes \
         model), which a checkpoint would lose: spec.futureField, spec.containers[0].futureKnob; \
         upgrade pod-checkpointer to checkpoint it"
    );
    assert_eq!(refusal.uid.as_deref(), Some("uid-a"));
}

#[test]
fn a_field_the_kubelet_drops_is_a_warning() {
    let sidecar = PodSpec {
        sidecar: true,
        ..parent("a")
    };
    let d = World::synced(&[("a", sidecar)]).kubelet(1, 20).decide();
    assert_eq!(
        d.report.warnings[&id("a")],
        [
            "spec.initContainers[0].restartPolicy: needs a kubelet ≥v1.28; v1.20 drops it (from the parent too)"
        ]
    );
}

/// A parent Ready on a synced view: its content becomes known-good after a minute, the
/// pass asks to look again then, and the journal's state carries the proof, through an
/// outage too.
#[test]
fn a_ready_parents_content_becomes_known_good_after_a_minute() {
    let mut world = World::synced(&[("a", parent("a"))]).disk(&[("a", "h1")]);
    let (id_a, pod) = pod("a", parent("a"));
    let mut ready = (*pod).clone();
    ready.status = Some(serde_json::from_value(ready_status("a", Timestamp(0))).expect("a status"));
    world.observation.pods.insert(id_a.clone(), Arc::new(ready));
    let mut world = world.runtime_runs_the_statuses();
    let hash = world.hash_of("a");

    let first = decide(
        &world.observation,
        &world.disk,
        &PersistentState::default(),
        &world.verdicts,
        &world.config,
        NOW,
    );
    assert_eq!(first.state.ready_since[&id_a].spec_hash, hash);
    assert!(first.state.known_good.is_empty());
    let due = NOW.saturating_add(crate::known_good::KNOWN_GOOD_AFTER);
    assert_eq!(first.report.next_deadline, Some(due));

    let second = decide(
        &world.observation,
        &world.disk,
        &first.state,
        &world.verdicts,
        &world.config,
        due,
    );
    assert_eq!(second.state.known_good[&id_a].spec_hash, hash);
    assert!(second.state.ready_since.is_empty());

    // The API unreachable: the proof stays.
    world.observation.api = ApiState::Unreachable;
    let offline = decide(
        &world.observation,
        &world.disk,
        &second.state,
        &world.verdicts,
        &world.config,
        due,
    );
    assert_eq!(offline.state.known_good, second.state.known_good);
}

/// Issue 36, through `decide` and the journal: a Secret a container reads in `env` rotated
/// under the running pod is not proven by the pod staying Ready, only once its container
/// restarted after the rotation was seen; the Secret's volume alone would be proven after
/// the kubelet's sync allowance.
#[test]
fn a_rotated_secret_is_proven_by_how_its_container_reads_it() {
    let secs = |s: i64| Timestamp(s * 1000);
    let with_pod = |world: &mut World, env: bool, started: Timestamp| {
        let spec = PodSpec {
            mounts: Some("present"),
            ..parent("a")
        };
        let (id_a, pod) = pod("a", spec);
        let mut pod = (*pod).clone();
        let mut container = json!({"name": "c", "image": "registry.example/c:1",
                                   "volumeMounts": [{"name": "s", "mountPath": "/s"}]});
        if env {
            container["env"] =
                json!([{"name": "K", "valueFrom": {"secretKeyRef": {"name": "present", "key": "k"}}}]);
        }
        if let Some(spec) = pod.spec.as_mut() {
            spec.containers = vec![serde_json::from_value(container).expect("a container")];
        }
        pod.status = Some(serde_json::from_value(ready_status("a", started)).expect("a status"));
        world.observation.pods.insert(id_a, Arc::new(pod));
        *world = std::mem::replace(world, World::synced(&[])).runtime_runs_the_statuses();
    };
    let rotate = |world: &mut World| {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": "present", "namespace": NS}, "data": {"k": "dzI="}}))
        .expect("a valid secret");
        let view = world
            .observation
            .objects
            .get_mut(NS)
            .expect("the namespace's objects");
        view.objects.secrets.insert("present".into(), secret.into());
    };
    let pass = |world: &World, state: &PersistentState, now: Timestamp| {
        decide(
            &world.observation,
            &world.disk,
            state,
            &world.verdicts,
            &world.config,
            now,
        )
    };
    let proven = |state: &PersistentState| state.known_good.get(&id("a")).map(|k| k.spec_hash.clone());

    for env in [true, false] {
        let what = if env { "in env" } else { "in a volume only" };
        let mut world = World::synced(&[]);
        with_pod(&mut world, env, secs(900));
        let first = pass(&world, &PersistentState::default(), NOW);
        let old = first.state.ready_since[&id("a")].spec_hash.clone();
        let proved = pass(&world, &first.state, secs(1_060));
        assert_eq!(
            proven(&proved.state),
            Some(old.clone()),
            "{what}: first content, a minute"
        );

        rotate(&mut world);
        let seen = pass(&world, &proved.state, secs(1_100));
        let new = seen.state.ready_since[&id("a")].spec_hash.clone();
        assert_ne!(new, old, "{what}: the rotation is new content");
        let later = pass(&world, &seen.state, secs(1_600));
        if env {
            // Was proven at 1 160: the container still had the old value.
            assert_eq!(
                proven(&later.state),
                Some(old.clone()),
                "{what}: Ready for 500 s, not restarted"
            );
            assert_eq!(
                seen.report.next_deadline, None,
                "{what}: nothing due before a restart"
            );
            with_pod(&mut world, env, secs(1_700));
            let restarted = pass(&world, &later.state, secs(1_700));
            assert_eq!(
                restarted.report.next_deadline,
                Some(secs(1_760)),
                "{what}: due a minute after the restart"
            );
            let after = pass(&world, &restarted.state, secs(1_760));
            assert_eq!(
                proven(&after.state),
                Some(new),
                "{what}: proven by the restarted container"
            );
        } else {
            assert_eq!(
                seen.report.next_deadline,
                Some(secs(1_310)),
                "{what}: after the sync allowance and a minute"
            );
            assert_eq!(proven(&later.state), Some(new), "{what}: proven with no restart");
        }
    }
}

/// A pod like [`pod`]'s, Ready on a synced view.
fn ready_pod(name: &str, spec: PodSpec<'_>) -> (PodId, Arc<Pod>) {
    let (id, pod) = pod(name, spec);
    let mut ready = (*pod).clone();
    ready.status = Some(serde_json::from_value(ready_status(name, Timestamp(0))).expect("a status"));
    (id, Arc::new(ready))
}

/// The status of a pod Ready since long before [`NOW`] (past [`crate::READY_SETTLE`]),
/// its one container `c` running since `started` as `containerd://ctr-<name>`.
fn ready_status(name: &str, started: Timestamp) -> serde_json::Value {
    json!({
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "1970-01-01T00:00:00Z"}],
        "containerStatuses": [{"name": "c", "ready": true, "restartCount": 0, "image": "", "imageID": "",
                               "containerID": format!("containerd://ctr-{name}"),
                               "state": {"running": {"startedAt": started.to_rfc3339()}}}]
    })
}

impl World {
    /// The runtime runs the containers every pod's status names as running, as their ids
    /// say: the statuses are current (not kept by the API from before a reboot).
    fn runtime_runs_the_statuses(mut self) -> Self {
        let mut containers: BTreeMap<PodId, BTreeSet<String>> = BTreeMap::new();
        for (id, pod) in &self.observation.pods {
            let statuses = (pod.status.as_ref()).and_then(|s| s.container_statuses.as_deref());
            for s in statuses.unwrap_or_default() {
                if let Some(c) = s.container_id.as_deref() {
                    containers
                        .entry(id.clone())
                        .or_default()
                        .insert(crate::runtime_id(c).to_owned());
                }
            }
        }
        let (kubelet_parents, restarts) = match &self.observation.local {
            LocalView::Known {
                kubelet_parents,
                restarts,
                ..
            } => (kubelet_parents.clone(), restarts.clone()),
            LocalView::Unknown => Default::default(),
        };
        self.observation.local = LocalView::Known {
            running: containers.keys().cloned().collect(),
            containers,
            kubelet_parents,
            restarts,
        };
        self
    }
}

/// The journal's proofs and streaks after a pass: they follow what the plan keeps, and
/// what it sets aside (known-good tracking reads the plan's outcome).
#[test]
fn known_good_tracking_follows_the_plans_outcome() {
    /// (what, the world, the journal before, known-good after, ready-since after)
    type Case<'a> = (&'a str, World, PersistentState, &'a [&'a str], &'a [&'a str]);
    let since = |names: &[&str]| -> BTreeMap<PodId, SpecSince> {
        (names.iter())
            .map(|n| {
                (
                    id(n),
                    SpecSince {
                        spec_hash: "h1".into(),
                        since: Timestamp(0),
                    },
                )
            })
            .collect()
    };
    let journal = |known_good: &[&str], ready_since: &[&str]| PersistentState {
        known_good: since(known_good),
        ready_since: since(ready_since),
        ..PersistentState::default()
    };
    // The agent's own DaemonSet read as deleted (no grace period): self-GC. It used to be
    // not looked up, its checkpoint going by its verdict; an unknown scheduling never
    // self-GCs now (issue 36: only positive evidence removes).
    let mut self_gc = World::synced(&[]).disk(&[("pc-abc", "h1"), ("b", "h1")]);
    (self_gc.observation.daemon_sets)
        .insert(OwnerKey::new(NS, &owner("pod-checkpointer")), Fetched::NotFound);
    // Two known-good revisions of a DaemonSet, the newer one active and crash-looping
    // while the API is unreachable.
    let mut crash_loop = World::synced(&[])
        .api(ApiState::Unreachable)
        .disk(&[("api-1", "h1"), ("api-2", "h1")]);
    if let Some(d) = crash_loop.disk.get_mut(&id("api-2")) {
        if let Some(c) = d.inactive.as_mut() {
            c.meta.checkpointed_at = Some(Timestamp(1_000));
        }
        d.active = d.inactive.clone();
    }
    crash_loop.observation.local = LocalView::Known {
        running: BTreeSet::new(),
        containers: BTreeMap::new(),
        kubelet_parents: BTreeSet::new(),
        restarts: BTreeMap::from([(id("api-2"), CRASH_LOOP_RESTARTS)]),
    };
    let mut crash_loop_journal = journal(&["api-1", "api-2"], &["api-2"]);
    crash_loop_journal.restarts_seen.insert(
        id("api-2"),
        RestartsSeen {
            first: 0,
            since: Timestamp(0),
        },
    );
    let mut written = World::synced(&[]);
    written.observation.pods = BTreeMap::from([ready_pod("a", parent("a"))]);
    let written = written.runtime_runs_the_statuses();
    let cases: Vec<Case<'_>> = vec![
        (
            "a checkpoint removed by its verdict takes its proof and its streak along",
            World::synced(&[])
                .disk(&[("b", "h1"), ("c", "h1")])
                .verdict("b", GcVerdict::RemoveNow),
            journal(&["b", "c"], &["b", "c"]),
            &["c"],
            // A synced view without a Ready parent breaks every streak.
            &[],
        ),
        (
            "a self-GC takes every proof",
            self_gc,
            journal(&["b", "pc-abc"], &["b"]),
            &[],
            &[],
        ),
        // Was: the set-aside revision lost its mark. Issue 36: restarts alone never take a
        // mark for good; it is suspended (`PersistentState::suspended`) instead.
        (
            "a revision set aside keeps its mark, suspended; the one replacing it keeps its \
             own, and an outage keeps the streaks",
            crash_loop,
            crash_loop_journal,
            &["api-1", "api-2"],
            &["api-2"],
        ),
        (
            "a Ready parent checkpointed in this pass starts its streak",
            written,
            PersistentState::default(),
            &[],
            &["a"],
        ),
    ];
    for (what, world, state, known_good, ready_since) in cases {
        let decision = decide(
            &world.observation,
            &world.disk,
            &state,
            &world.verdicts,
            &world.config,
            NOW,
        );
        assert_eq!(
            names(decision.state.known_good.keys()),
            list(known_good),
            "{what}: known-good"
        );
        assert_eq!(
            names(decision.state.ready_since.keys()),
            list(ready_since),
            "{what}: ready since"
        );
    }
}

/// The content records round-trip through the journal's JSON, a part without a time
/// (seen with the pod) without the field.
#[test]
fn content_records_round_trip_through_the_journal() {
    let state = PersistentState {
        content_seen: BTreeMap::from([(
            id("a"),
            crate::ContentSeen {
                uid: Some("uid-a".into()),
                read_at_start: "s1".into(),
                read_at_start_since: None,
                updated_in_place: "v1".into(),
                updated_in_place_since: Some(Timestamp(5_000)),
            },
        )]),
        ..PersistentState::default()
    };
    let written = serde_json::to_string(&state).expect("writes");
    assert!(
        written.contains(
            r#""content_seen":[{"namespace":"kube-system","name":"a","uid":"uid-a","read_at_start":"s1","updated_in_place":"v1","updated_in_place_since":5000}]"#
        ),
        "{written}"
    );
    let read: PersistentState = serde_json::from_str(&written).expect("reads back");
    assert_eq!(read, state);
}

/// The journal of an agent from before known-good tracking still reads.
#[test]
fn an_older_journal_reads_with_nothing_known_good() {
    let old = r#"{"absent_since":[{"namespace":"kube-system","name":"a","since":1000}]}"#;
    let state: PersistentState = serde_json::from_str(old).expect("an older journal");
    assert_eq!(state.absent_since.len(), 1);
    assert!(state.known_good.is_empty() && state.ready_since.is_empty());
    assert_eq!(state.self_gc_since, None, "no self-GC clock started");
    let written = serde_json::to_string(&state).unwrap();
    assert_eq!(
        written,
        r#"{"absent_since":[{"namespace":"kube-system","name":"a","since":1000}],"known_good":[],"ready_since":[]}"#,
        "the entries keep their fields"
    );
    let round_trip: PersistentState = serde_json::from_str(&written).expect("reads back");
    assert_eq!(round_trip, state);
    let clock = PersistentState {
        self_gc_since: Some(Timestamp(2_000)),
        ..state
    };
    let written = serde_json::to_string(&clock).unwrap();
    assert!(written.ends_with(r#","self_gc_since":2000}"#), "{written}");
    assert_eq!(
        serde_json::from_str::<PersistentState>(&written).expect("reads back"),
        clock
    );
}

/// A checkpoint whose pod is gone while its DaemonSet still targets this node and asks
/// for checkpoints is kept past the strategy's verdict (a rollout, an eviction or a
/// controller outage), and so is one whose DaemonSet or node cannot be read (issue 36: a
/// failed read keeps the last safe state); only a read saying otherwise leaves it to the
/// strategy.
#[test]
fn a_checkpoint_stays_while_its_daemon_set_targets_the_node() {
    let cp = json!({"node-role.kubernetes.io/control-plane": ""});
    let uid = "uid-kube-apiserver";
    let api = |uid: &str, selector: serde_json::Value, checkpoint: &str| {
        checkpointed_daemon_set("kube-apiserver", uid, selector, checkpoint)
    };
    // (what, the DaemonSet as fetched, the node as fetched, removed)
    let cases: Vec<(&str, Fetched<_>, Fetched<_>, bool)> = vec![
        (
            "targets the node",
            api(uid, cp.clone(), "true"),
            node(cp.clone()),
            false,
        ),
        (
            "no longer targets the node",
            api(uid, json!({"other": "x"}), "true"),
            node(cp.clone()),
            true,
        ),
        (
            "its pods are no longer checkpointed",
            api(uid, cp.clone(), "false"),
            node(cp.clone()),
            true,
        ),
        (
            "re-created under the same name",
            api("uid-new", cp.clone(), "true"),
            node(cp.clone()),
            true,
        ),
        ("deleted", Fetched::NotFound, node(cp.clone()), true),
        // The next three were removed: one flaky GET dropped the protection of a due
        // active kube-apiserver revision. Issue 36's rule: a failed, timed-out or
        // forbidden read keeps the last safe state.
        (
            "unreadable",
            Fetched::Failed("403".into()),
            node(cp.clone()),
            false,
        ),
        (
            "the node unreadable",
            api(uid, cp.clone(), "true"),
            Fetched::Failed("403".into()),
            false,
        ),
        (
            "the node not registered (404)",
            api(uid, cp.clone(), "true"),
            Fetched::NotFound,
            false,
        ),
        // What the DaemonSet read says needs no node.
        (
            "the node unreadable, the DaemonSet deleted",
            Fetched::NotFound,
            Fetched::Failed("timed out".into()),
            true,
        ),
        (
            "the node unreadable, the DaemonSet's pods no longer checkpointed",
            api(uid, cp.clone(), "false"),
            Fetched::Failed("timed out".into()),
            true,
        ),
        (
            "the node unreadable, the DaemonSet re-created",
            api("uid-new", cp.clone(), "true"),
            Fetched::Failed("timed out".into()),
            true,
        ),
        // Not a failed read: the observer looks up every orphan's DaemonSet, so this is
        // never an orphan's in an agent; left to the strategy as before.
        ("not looked up", Fetched::NotFetched, node(cp.clone()), true),
    ];
    for (what, ds, node, removed) in cases {
        let mut world = World::synced(&[])
            .disk(&[("api-old", "h1")])
            .verdict("api-old", GcVerdict::RemoveNow);
        (world.observation.daemon_sets).insert(OwnerKey::new(NS, &owner("kube-apiserver")), ds);
        world.observation.node = node;
        let decision = world.decide();
        let expected: &[&str] = if removed { &["api-old"] } else { &[] };
        assert_eq!(
            names(decision.removes.iter().map(|r| &r.id)),
            list(expected),
            "{what}"
        );
        // Not on a view that is not synced, even with the facts at hand.
        world.observation.api = ApiState::Reachable;
        assert!(world.decide().removes.is_empty(), "{what}: not synced");
    }
}

#[test]
fn daemon_sets_to_look_up_are_the_agents_and_those_of_absent_parents() {
    let world = World::synced(&[("api-new", parent("api-new"))]).disk(&[
        ("api-old", "h1"),
        ("pc-abc", "h1"),
        ("b", "h1"),
    ]);
    let check = |api: ApiState, expected: &[&str]| {
        let (pods, disk, me) = (&world.observation.pods, &world.disk, &world.config.me);
        let wanted = daemon_set_lookups(api, pods, disk, me, &world.config.allowed);
        let actual: Vec<&str> = wanted.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(actual, expected, "{api:?}");
    };
    check(ApiState::Synced, &["kube-apiserver", "pod-checkpointer"]);
    check(ApiState::Reachable, &[]);
}

/// Issue 36: a namespace removed from `--namespaces` stays in the local view for its
/// active checkpoints only (each is retired once its parent is seen running); not for
/// inactive ones, nor the agent's own, nor while it is allowed.
#[test]
fn the_local_view_covers_namespaces_of_active_checkpoints_outside_the_allow_list() {
    let check = |what: &str, allowed: &str, active: &[&str], expected: &[&str]| {
        let mut world =
            World::synced(&[])
                .only_allow(allowed)
                .disk(&[("api-a", "h1"), ("pc-abc", "h1"), ("b", "h1")]);
        for name in active {
            let d = world.disk.get_mut(&id(name)).expect("on disk");
            d.active.clone_from(&d.inactive);
        }
        let got = local_namespaces_outside(&world.disk, &world.config.allowed, &world.config.me);
        assert_eq!(
            got.iter().map(String::as_str).collect::<Vec<_>>(),
            expected,
            "{what}"
        );
    };
    check("allowed", NS, &["api-a", "b"], &[]);
    check("removed, every checkpoint inactive", "cni", &[], &[]);
    check("removed, one active", "cni", &["b"], &[NS]);
    check("removed, the agent's own active only", "cni", &["pc-abc"], &[]);
}

/// Issue 36: while the agent's own pod is gone, the DaemonSet of an active checkpoint is
/// looked up even though its pod is listed (a failed handoff): a due self-GC spares it if
/// that DaemonSet still targets the node, so it must be read.
#[test]
fn daemon_sets_of_active_checkpoints_are_looked_up_while_the_agents_pod_is_gone() {
    let check = |what: &str, listed: &[&str], expected: &[&str]| {
        let pods: Vec<(&str, PodSpec<'_>)> = listed.iter().map(|n| (*n, parent(n))).collect();
        let mut world = World::synced(&pods).disk(&[("api-new", "h1"), ("pc-abc", "h1")]);
        for d in world.disk.values_mut() {
            d.active.clone_from(&d.inactive);
        }
        let (pods, disk, me) = (&world.observation.pods, &world.disk, &world.config.me);
        let wanted = daemon_set_lookups(ApiState::Synced, pods, disk, me, &world.config.allowed);
        let actual: Vec<&str> = wanted.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(actual, expected, "{what}");
    };
    check(
        "the agent's pod gone: its DaemonSet and the active one's",
        &["api-new"],
        &["kube-apiserver", "pod-checkpointer"],
    );
    check("the agent's pod listed: neither", &["api-new", "pc-abc"], &[]);
}

#[test]
fn checkpoints_whose_files_cannot_be_read_are_left_alone() {
    let check = |what: &str,
                 mut decision: Decision,
                 unreadable: &[&str],
                 expected: (&[&str], &[&str], &[&str], &[&str], bool)| {
        decision.leave_alone(&unreadable.iter().map(|n| id(n)).collect());
        let (writes, stops, starts, removes, self_gc) = expected;
        assert_eq!(
            names(decision.writes.iter().map(|c| &c.parent)),
            list(writes),
            "{what}: writes"
        );
        assert_eq!(names(&decision.stops), list(stops), "{what}: stops");
        assert_eq!(names(&decision.starts), list(starts), "{what}: starts");
        assert_eq!(
            names(decision.removes.iter().map(|r| &r.id)),
            list(removes),
            "{what}: removes"
        );
        assert_eq!(decision.self_gc, self_gc, "{what}: self-GC");
    };
    let removal = |name: &str, is_self: bool| Removal {
        id: id(name),
        reason: RemovalReason::Completed,
        is_self,
    };
    let steps = || Decision {
        writes: World::synced(&[("a", parent("a")), ("b", parent("b"))])
            .decide()
            .writes,
        stops: vec![id("a"), id("c")],
        starts: vec![id("b"), id("d")],
        removes: vec![removal("e", false), removal("f", false)],
        ..Decision::default()
    };
    check(
        "nothing unreadable",
        steps(),
        &[],
        (&["a", "b"], &["a", "c"], &["b", "d"], &["e", "f"], false),
    );
    check(
        "a and d",
        steps(),
        &["a", "d"],
        (&["b"], &["c"], &["b"], &["e", "f"], false),
    );
    check(
        "every step of b",
        steps(),
        &["b", "e"],
        (&["a"], &["a", "c"], &["d"], &["f"], false),
    );
    let self_gc = Decision {
        removes: vec![removal("e", false), removal("pc-abc", true)],
        self_gc: true,
        ..Decision::default()
    };
    check(
        "a self-GC waits for every checkpoint",
        self_gc.clone(),
        &["e"],
        (&[], &[], &[], &[], false),
    );
    check(
        "a self-GC with everything readable",
        self_gc,
        &[],
        (&[], &[], &[], &["e", "pc-abc"], true),
    );
}

/// The node's watch budget: parents in order (the same age here: by namespace and name), objects shared
/// between parents counted once; one whose new objects would go past the bound is
/// refused and nothing of it is watched, and a later one that fits is served.
#[test]
fn parents_past_the_nodes_watch_budget_are_refused_and_not_watched() {
    let referencing = |name: &str, secrets: std::ops::Range<usize>| {
        let (id, pod) = pod(name, parent(name));
        let mut pod = (*pod).clone();
        let env: Vec<serde_json::Value> = secrets
            .map(|i| json!({"name": format!("E{i}"), "valueFrom": {"secretKeyRef": {"name": format!("s{i}"), "key": "k"}}}))
            .collect();
        pod.spec.as_mut().unwrap().containers[0].env = Some(serde_json::from_value(json!(env)).unwrap());
        (id, Arc::new(pod))
    };
    let per_pod = MAX_OBJECTS_PER_POD;
    let fitting = MAX_WATCHED_OBJECTS / per_pod;
    let mut world = World::synced(&[]);
    for i in 0..fitting {
        let (id, pod) = referencing(&format!("a{i}"), i * per_pod..(i + 1) * per_pod);
        world.observation.pods.insert(id, pod);
    }
    // Past the budget with one object of its own; then one that shares every object.
    let (over, pod) = referencing("b-over", 0..per_pod - 1);
    let mut pod = (*pod).clone();
    let env = pod.spec.as_mut().unwrap().containers[0].env.as_mut().unwrap();
    env.push(
        serde_json::from_value(
            json!({"name": "NEW", "valueFrom": {"secretKeyRef": {"name": "new", "key": "k"}}}),
        )
        .unwrap(),
    );
    world.observation.pods.insert(over.clone(), Arc::new(pod));
    let (shared, pod) = referencing("c-shared", 0..per_pod);
    world.observation.pods.insert(shared.clone(), pod);

    let d = world.decide();
    assert_eq!(names(d.report.refusals.keys()), names([&over]));
    assert_eq!(
        d.report.refusals[&over].message,
        format!(
            "references 1 Secrets and ConfigMaps not watched yet, and the agent already watches {MAX_WATCHED_OBJECTS} of the {MAX_WATCHED_OBJECTS} it watches on a node (for parents before it: its own pod, the control plane's, then the older ones)"
        )
    );
    assert!(!d.report.refusals.contains_key(&shared));
    let watched = required_by_namespace(&world.observation.pods, &world.config.allowed, &world.config.me);
    assert_eq!(watched[NS].len(), MAX_WATCHED_OBJECTS);
    assert!(
        !watched[NS].secrets.contains("new"),
        "nothing of the refused pod is watched"
    );
}

/// The pods whose data directories a pass removes: `with_data` are the pods with data
/// on disk, `everything_read` whether every checkpoint file was read.
fn check_orphan_data(world: &World, with_data: &[&str], everything_read: bool, expected: &[&str]) {
    let mut d = world.decide();
    let with_data: BTreeSet<PodId> = with_data.iter().map(|n| id(n)).collect();
    d.remove_orphan_data(&with_data, &world.disk, everything_read);
    assert_eq!(names(&d.remove_data), list(expected));
    assert!(expected.is_empty() || !d.is_noop(), "removing data is a change");
}

/// Data directories that belong to no checkpoint (a crash between the data and the
/// manifest, or during a removal) go on a synced pass that read everything; only `drain`
/// removed them before.
#[test]
fn data_of_no_checkpoint_is_removed_on_a_synced_pass_only() {
    let on_disk = || World::synced(&[("a", parent("a"))]).disk(&[("a", "x"), ("b", "y")]);
    let a_written = on_disk();
    let a_hash = a_written.hash_of("a");
    let settled = World::synced(&[("a", parent("a")), ("b", parent("b"))]).disk(&[("a", &a_hash)]);
    // (case, world, pods with data, every file read, data removed)
    type Case<'a> = (&'a str, World, &'a [&'a str], bool, &'a [&'a str]);
    let cases: Vec<Case<'_>> = vec![
        (
            "data of checkpoints on disk stays",
            on_disk(),
            &["a", "b"],
            true,
            &[],
        ),
        (
            "data of no checkpoint goes",
            on_disk(),
            &["a", "c", "d"],
            true,
            &["c", "d"],
        ),
        (
            "not while a checkpoint file could not be read",
            on_disk(),
            &["c"],
            false,
            &[],
        ),
        (
            "not on a view that is not synced",
            on_disk().api(ApiState::Reachable),
            &["c"],
            true,
            &[],
        ),
        (
            "not in an outage",
            on_disk().api(ApiState::Unreachable),
            &["c"],
            true,
            &[],
        ),
        (
            "not the data of a checkpoint this pass writes (a crash left its data, not its manifest)",
            settled,
            &["a", "b"],
            true,
            &[],
        ),
    ];
    for (name, world, with_data, everything_read, expected) in cases {
        eprintln!("case: {name}");
        check_orphan_data(&world, with_data, everything_read, expected);
    }
}

/// Issue 36, the evidence rule for `Ready` ([`crate::readiness`]): an active `when-ready`
/// checkpoint stays while its parent's Ready is no evidence — a status the API kept from
/// before a reboot (it names a container the runtime no longer runs), or a Ready flash (a
/// crash-looping kube-apiserver whose probe the checkpoint itself answered: a real node
/// showed it) — and retires once the parent's current containers have been Ready for
/// [`crate::READY_SETTLE`], or at once for content the pod proved (known to work: the
/// shorter two kube-apiservers share a port, the better). On the API's word alone it
/// retired in every case.
#[test]
fn a_when_ready_checkpoint_retires_only_on_settled_current_readiness() {
    let secs = |s: i64| Timestamp(s * 1000);
    // (what, the Ready condition's transition, the container the runtime runs, what says the
    // content works ("proof": the pod's known-good mark; "own": its own checkpoint active
    // with that content), now, retired, the next look)
    type Case<'a> = (
        &'a str,
        Timestamp,
        &'a str,
        &'a str,
        Timestamp,
        bool,
        Option<Timestamp>,
    );
    let cases: Vec<Case<'_>> = vec![
        (
            "Ready for long, its container runs",
            Timestamp(0),
            "ctr-a",
            "",
            NOW,
            true,
            None,
        ),
        (
            "a status kept from before a reboot: another container runs",
            Timestamp(0),
            "ctr-a-after-the-cut",
            "proof",
            NOW,
            false,
            None,
        ),
        (
            "a Ready flash of 2 s",
            secs(998),
            "ctr-a",
            "",
            NOW,
            false,
            Some(secs(1_008)),
        ),
        (
            "the same Ready, settled",
            secs(998),
            "ctr-a",
            "",
            secs(1_008),
            true,
            None,
        ),
        // Known to work: no second more beside the checkpoint than needed.
        (
            "Ready 2 s with content it proved",
            secs(998),
            "ctr-a",
            "proof",
            NOW,
            true,
            None,
        ),
        (
            "Ready 2 s, its own checkpoint serving that content (a power cut)",
            secs(998),
            "ctr-a",
            "own",
            NOW,
            true,
            None,
        ),
    ];
    for (what, transition, running, known, now, retired, next) in cases {
        let (id_a, pod) = pod("a", parent("a"));
        let mut pod = (*pod).clone();
        pod.metadata.annotations.get_or_insert_default().insert(
            "checkpointer.alpha.coreos.com/handoff".into(),
            "when-ready".into(),
        );
        let mut status = ready_status("a", Timestamp(0));
        status["conditions"][0]["lastTransitionTime"] = transition.to_rfc3339().into();
        pod.status = Some(serde_json::from_value(status).expect("a status"));
        let mut world = World::synced(&[]).disk(&[("a", "h1")]);
        world.observation.pods.insert(id_a.clone(), Arc::new(pod));
        if let Some(d) = world.disk.get_mut(&id_a) {
            if let Some(c) = d.inactive.as_mut() {
                c.meta.retires_when_ready = true;
            }
            d.active = d.inactive.clone();
        }
        world.observation.local = LocalView::Known {
            running: BTreeSet::from([id_a.clone()]),
            containers: BTreeMap::from([(id_a.clone(), BTreeSet::from([running.to_owned()]))]),
            kubelet_parents: BTreeSet::new(),
            restarts: BTreeMap::new(),
        };
        let hash = world.hash_of("a");
        if known == "own"
            && let Some(active) = world.disk.get_mut(&id_a).and_then(|d| d.active.as_mut())
        {
            active.meta.spec_hash = Some(hash.clone());
        }
        let mut journal = PersistentState::default();
        if known == "proof" {
            let proof = SpecSince {
                spec_hash: hash,
                since: Timestamp(0),
            };
            journal.known_good.insert(id_a.clone(), proof);
        }
        let d = decide(
            &world.observation,
            &world.disk,
            &journal,
            &world.verdicts,
            &world.config,
            now,
        );
        assert_eq!(d.stops.contains(&id_a), retired, "{what}: retired");
        let settles = d.report.next_deadline.filter(|t| Some(*t) == next);
        assert_eq!(
            settles, next,
            "{what}: the next look ({:?})",
            d.report.next_deadline
        );
    }
}
