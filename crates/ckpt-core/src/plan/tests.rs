//! Planner tests: bootkube's transition table as adapted by ARCHITECTURE.md, Planner rules, self handling,
//! one test per fixed bootkube bug, and properties over random worlds.

use std::time::Duration;

use proptest::prelude::*;

use super::rows::{Gathered, gather};
use super::*;
use crate::checkpoint::CheckpointMeta;
use crate::gc::GcDecision;
use crate::identity::ControllerOwner;
use crate::journal::{RestartsSeen, SpecSince};
use crate::known_good::ParentContent;
use crate::observation::{ApiParent, LocalView, StoredCopy};
use crate::revisions::{Lineage, RevisionSettings};

const NS: &str = "kube-system";
const NOW: Timestamp = Timestamp(1_000_000);

fn id(name: &str) -> PodId {
    PodId::new(NS, name)
}

fn ds_owner(name: &str) -> ControllerOwner {
    ControllerOwner {
        api_version: "apps/v1".into(),
        kind: "DaemonSet".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
    }
}

fn me() -> SelfIdentity {
    SelfIdentity::new(NS, "pc-abc", "node-1").with_owner(Some(ds_owner("pod-checkpointer")))
}

/// A parent whose name starts with `shared-` binds beside its checkpoint (`when-ready`).
fn when_ready(name: &str) -> bool {
    name.starts_with("shared-")
}

fn copy(name: &str, hash: &str, owner: Option<ControllerOwner>) -> StoredCopy {
    StoredCopy {
        meta: CheckpointMeta {
            parent: id(name),
            parent_uid: Some(format!("uid-{name}")),
            owner,
            spec_hash: Some(hash.into()),
            template_generation: None,
            checkpointed_at: None,
            retires_when_ready: when_ready(name),
        },
        digest: hash.into(),
    }
}

/// A disk entry from a short code: `I` inactive, `A` active, `IA` both (same content),
/// `IA*` both with different content.
fn on_disk(name: &str, code: &str) -> (PodId, DiskCheckpoint) {
    let owner = owner_of(name);
    let inactive = code.contains('I').then(|| copy(name, "h1", owner.clone()));
    let active_hash = if code.ends_with('*') { "h0" } else { "h1" };
    let active = code.contains('A').then(|| copy(name, active_hash, owner));
    (id(name), DiskCheckpoint { inactive, active })
}

#[derive(Clone, Debug)]
struct World {
    api: ApiView,
    local: LocalView,
    disk: BTreeMap<PodId, DiskCheckpoint>,
    desired: BTreeMap<PodId, String>,
    /// Made from `desired`: each content wholly read at start, so a pod's content counts
    /// as it did before content parts (`known_good`'s tables cover them).
    contents: BTreeMap<PodId, ParentContent>,
    verdicts: BTreeMap<PodId, GcDecision>,
    state: PersistentState,
    me: SelfIdentity,
    /// Unknown with no grace by default: as when the agent's own DaemonSet cannot be read,
    /// nothing self-GCs (issue 36: only a read saying deleted or descheduled does).
    scheduling: SelfScheduling,
    grace: Duration,
    allowed: NamespaceAllowList,
    ready: BTreeSet<PodId>,
    terminating: BTreeSet<PodId>,
    revisions: RevisionSettings,
    live: BTreeSet<Lineage>,
    /// The Node is marked for decommissioning.
    decommissioned: bool,
    /// When [`World::apply`] says a write happened.
    clock: Timestamp,
}

/// The owner the test gives a pod, by its name: the agent's own DaemonSet for `pc-*`, a
/// `kube-apiserver` DaemonSet for `api-*`, none for the others.
fn owner_of(name: &str) -> Option<ControllerOwner> {
    if name.starts_with("pc-") {
        Some(ds_owner("pod-checkpointer"))
    } else if name.starts_with("api-") || when_ready(name) {
        Some(ds_owner("kube-apiserver"))
    } else {
        None
    }
}

impl World {
    fn new(disk: &[(&str, &str)]) -> Self {
        Self {
            api: ApiView::Unreachable,
            local: LocalView::Known {
                running: BTreeSet::new(),
                containers: BTreeMap::new(),
                kubelet_parents: BTreeSet::new(),
                restarts: BTreeMap::new(),
            },
            disk: disk.iter().map(|(n, c)| on_disk(n, c)).collect(),
            desired: BTreeMap::new(),
            contents: BTreeMap::new(),
            verdicts: BTreeMap::new(),
            state: PersistentState::default(),
            me: me(),
            scheduling: SelfScheduling::Unknown("not looked up".into()),
            grace: Duration::ZERO,
            allowed: NamespaceAllowList::new([NS]),
            ready: BTreeSet::new(),
            terminating: BTreeSet::new(),
            revisions: RevisionSettings::default(),
            live: BTreeSet::new(),
            decommissioned: false,
            clock: NOW,
        }
    }

    /// `--namespaces` without this test's namespace: every checkpoint but the agent's
    /// own is outside the allow-list.
    fn namespace_removed(mut self) -> Self {
        self.allowed = NamespaceAllowList::new(["elsewhere"]);
        self
    }

    /// These listed parents have completed (Succeeded/Failed, restartPolicy Never or
    /// OnFailure).
    fn completed(mut self, names: &[&str]) -> Self {
        if let ApiView::Synced { parents } = &mut self.api {
            for name in names {
                if let Some(parent) = parents.get_mut(&id(name)) {
                    parent.completed = true;
                }
            }
        }
        self
    }

    fn synced(mut self, parents: &[&str]) -> Self {
        let parents = parents
            .iter()
            .map(|n| {
                let owner = owner_of(n);
                (
                    id(n),
                    ApiParent {
                        uid: Some(format!("uid-{n}")),
                        owner,
                        completed: false,
                        retires_when_ready: when_ready(n),
                        template_generation: None,
                    },
                )
            })
            .collect();
        self.api = ApiView::Synced { parents };
        self
    }

    /// The listed parents' `pod-template-generation` labels.
    fn generations(mut self, entries: &[(&str, i64)]) -> Self {
        if let ApiView::Synced { parents } = &mut self.api {
            for (name, generation) in entries {
                if let Some(parent) = parents.get_mut(&id(name)) {
                    parent.template_generation = Some(*generation);
                }
            }
        }
        self
    }

    fn api(mut self, api: ApiView) -> Self {
        self.api = api;
        self
    }

    fn running(mut self, names: &[&str]) -> Self {
        let restarts = match self.local {
            LocalView::Known { restarts, .. } => restarts,
            LocalView::Unknown => BTreeMap::new(),
        };
        self.local = LocalView::Known {
            running: names.iter().map(|n| id(n)).collect(),
            containers: BTreeMap::new(),
            kubelet_parents: BTreeSet::new(),
            restarts,
        };
        self
    }

    /// The runtime shows these restart counts of checkpoints' static pods.
    fn restarts(mut self, counts: &[(&str, u32)]) -> Self {
        if let LocalView::Known { restarts, .. } = &mut self.local {
            *restarts = counts.iter().map(|(n, c)| (id(n), *c)).collect();
        }
        self
    }

    fn local_unknown(mut self) -> Self {
        self.local = LocalView::Unknown;
        self
    }

    fn desired(mut self, entries: &[(&str, &str)]) -> Self {
        self.desired = entries.iter().map(|(n, h)| (id(n), (*h).to_owned())).collect();
        self.contents = (self.desired.iter())
            .map(|(id, hash)| {
                let content = ParentContent {
                    spec_hash: hash.clone(),
                    parts: crate::ContentParts {
                        read_at_start: hash.clone(),
                        updated_in_place: String::new(),
                    },
                    uid: None,
                    started: None,
                };
                (id.clone(), content)
            })
            .collect();
        self
    }

    fn verdict(mut self, name: &str, verdict: GcVerdict) -> Self {
        self.verdicts.insert(id(name), GcDecision::new(verdict, "test"));
        self
    }

    fn inputs(&self) -> PlanInputs<'_> {
        PlanInputs {
            api: &self.api,
            local: &self.local,
            disk: &self.disk,
            desired: &self.desired,
            contents: &self.contents,
            verdicts: &self.verdicts,
            state: &self.state,
            me: &self.me,
            scheduling: &self.scheduling,
            grace: self.grace,
            allowed: &self.allowed,
            ready: &self.ready,
            terminating: &self.terminating,
            revisions: &self.revisions,
            live: &self.live,
            decommissioned: self.decommissioned,
        }
    }

    fn plan(&self, now: Timestamp) -> Plan {
        plan(&self.inputs(), now)
    }

    /// Executes a plan against the simulated disk, as the store would.
    fn apply(&mut self, p: &Plan) {
        for w in &p.writes {
            let hash = &self.desired[w];
            let parent = match &self.api {
                ApiView::Synced { parents } => parents.get(w),
                _ => None,
            };
            let owner = parent.and_then(|p| p.owner.clone());
            let entry = self.disk.entry(w.clone()).or_insert(DiskCheckpoint {
                inactive: None,
                active: None,
            });
            let mut written = copy(&w.name, hash, owner);
            written.meta.checkpointed_at = Some(self.clock);
            written.meta.template_generation = parent.and_then(|p| p.template_generation);
            entry.inactive = Some(written);
        }
        for s in &p.stops {
            if let Some(d) = self.disk.get_mut(s) {
                d.active = None;
            }
        }
        for s in &p.starts {
            if let Some(d) = self.disk.get_mut(s) {
                d.active = d.inactive.clone();
            }
        }
        for r in &p.removes {
            self.disk.remove(&r.id);
        }
        self.state = p.state.clone();
    }
}

/// [`super::orphans`] of the planner's inputs, as `assess` asks for them.
fn orphans(inputs: &PlanInputs<'_>, now: Timestamp) -> Vec<Orphan> {
    super::orphans(
        inputs.api,
        inputs.disk,
        &inputs.state.absent_since,
        inputs.me,
        inputs.allowed,
        now,
    )
}

/// What a plan should contain, in names.
#[derive(Debug, Default, PartialEq, Eq)]
struct Expect<'a> {
    writes: Vec<&'a str>,
    stops: Vec<&'a str>,
    starts: Vec<&'a str>,
    removes: Vec<&'a str>,
    self_gc: bool,
}

fn names(ids: &[PodId]) -> Vec<&str> {
    ids.iter().map(|i| &*i.name).collect()
}

/// Asserts that a plan does what `expected` says, with `context` on failure.
fn expect_plan(p: &Plan, expected: &Expect<'_>, context: impl Fn() -> String) {
    let removes: Vec<PodId> = p.removes.iter().map(|r| r.id.clone()).collect();
    let got = Expect {
        writes: names(&p.writes),
        stops: names(&p.stops),
        starts: names(&p.starts),
        removes: names(&removes),
        self_gc: p.self_gc,
    };
    assert_eq!(&got, expected, "{}", context());
}

fn check(world: &World, expected: Expect<'_>, states: &[(&str, CheckpointState)]) -> Plan {
    let p = world.plan(NOW);
    expect_plan(&p, &expected, || format!("world: {world:#?}"));
    for (name, state) in states {
        assert_eq!(p.states.get(&id(name)), Some(state), "state of {name}");
    }
    p
}

fn expect<'a>(writes: &[&'a str], stops: &[&'a str], starts: &[&'a str], removes: &[&'a str]) -> Expect<'a> {
    Expect {
        writes: writes.to_vec(),
        stops: stops.to_vec(),
        starts: starts.to_vec(),
        removes: removes.to_vec(),
        self_gc: false,
    }
}

use CheckpointState::{Active, ActiveGrace, Inactive, InactiveGrace, Removed, SelfActive};

#[test]
fn transitions_of_an_ordinary_checkpoint() {
    let later = Timestamp(NOW.0 + 60_000);
    let reachable = ApiView::Reachable;
    // (disk code, world, expected stops, expected starts, expected removes, state)
    let cases: Vec<(&str, World, Expect<'_>, CheckpointState)> = vec![
        // API down.
        (
            "API down, parent runs: stay inactive",
            World::new(&[("p", "I")]).running(&["p"]),
            expect(&[], &[], &[], &[]),
            Inactive,
        ),
        (
            "API down, parent down: activate",
            World::new(&[("p", "I")]),
            expect(&[], &[], &["p"], &[]),
            Active,
        ),
        (
            "API down, runtime unknown: activate",
            World::new(&[("p", "I")]).local_unknown(),
            expect(&[], &[], &["p"], &[]),
            Active,
        ),
        (
            "API down, active, parent runs: deactivate",
            World::new(&[("p", "IA")]).running(&["p"]),
            expect(&[], &["p"], &[], &[]),
            Inactive,
        ),
        (
            "API down, active, parent down: stay",
            World::new(&[("p", "IA")]),
            expect(&[], &[], &[], &[]),
            Active,
        ),
        (
            "API down, active, runtime unknown: stay",
            World::new(&[("p", "IA")]).local_unknown(),
            expect(&[], &[], &[], &[]),
            Active,
        ),
        (
            "API down, only an active copy: stay",
            World::new(&[("p", "A")]),
            expect(&[], &[], &[], &[]),
            Active,
        ),
        // API synced with the parent listed.
        (
            "synced, parent runs",
            World::new(&[("p", "I")]).synced(&["p"]).running(&["p"]),
            expect(&[], &[], &[], &[]),
            Inactive,
        ),
        (
            "synced, parent listed but not started: no duplicate (bootkube activated)",
            World::new(&[("p", "I")]).synced(&["p"]),
            expect(&[], &[], &[], &[]),
            Inactive,
        ),
        (
            "synced, active, parent not back yet: stay active",
            World::new(&[("p", "IA")]).synced(&["p"]),
            expect(&[], &[], &[], &[]),
            Active,
        ),
        (
            "synced, active, parent runs: deactivate",
            World::new(&[("p", "IA")]).synced(&["p"]).running(&["p"]),
            expect(&[], &["p"], &[], &[]),
            Inactive,
        ),
        (
            "synced, runtime unknown: no start",
            World::new(&[("p", "I")]).synced(&["p"]).local_unknown(),
            expect(&[], &[], &[], &[]),
            Inactive,
        ),
        (
            "synced, runtime unknown: no stop",
            World::new(&[("p", "IA")]).synced(&["p"]).local_unknown(),
            expect(&[], &[], &[], &[]),
            Active,
        ),
        // API answering but not synced (403 while RBAC warms up).
        (
            "reachable: no activation",
            World::new(&[("p", "I")]).api(reachable.clone()),
            expect(&[], &[], &[], &[]),
            Inactive,
        ),
        (
            "reachable: deactivation still",
            World::new(&[("p", "IA")]).api(reachable.clone()).running(&["p"]),
            expect(&[], &["p"], &[], &[]),
            Inactive,
        ),
        // Garbage collection.
        (
            "orphan, remove now",
            World::new(&[("p", "IA")])
                .synced(&[])
                .verdict("p", GcVerdict::RemoveNow),
            expect(&[], &[], &[], &["p"]),
            Removed,
        ),
        (
            "orphan, deadline ahead (active)",
            World::new(&[("p", "IA")])
                .synced(&[])
                .verdict("p", GcVerdict::RemoveAt(later)),
            expect(&[], &[], &[], &[]),
            ActiveGrace(later),
        ),
        (
            "orphan, deadline ahead (inactive)",
            World::new(&[("p", "I")])
                .synced(&[])
                .verdict("p", GcVerdict::RemoveAt(later)),
            expect(&[], &[], &[], &[]),
            InactiveGrace(later),
        ),
        (
            "orphan, deadline exactly now",
            World::new(&[("p", "I")])
                .synced(&[])
                .verdict("p", GcVerdict::RemoveAt(NOW)),
            expect(&[], &[], &[], &["p"]),
            Removed,
        ),
        (
            "orphan, kept by the strategy",
            World::new(&[("p", "I")])
                .synced(&[])
                .verdict("p", GcVerdict::Keep),
            expect(&[], &[], &[], &[]),
            Inactive,
        ),
        (
            "orphan, no verdict yet: keep",
            World::new(&[("p", "I")]).synced(&[]),
            expect(&[], &[], &[], &[]),
            Inactive,
        ),
        (
            "verdict ignored unless synced (reachable)",
            World::new(&[("p", "I")])
                .api(reachable)
                .verdict("p", GcVerdict::RemoveNow),
            expect(&[], &[], &[], &[]),
            Inactive,
        ),
        (
            "verdict ignored unless synced (unreachable)",
            World::new(&[("p", "I")])
                .running(&["p"])
                .verdict("p", GcVerdict::RemoveNow),
            expect(&[], &[], &[], &[]),
            Inactive,
        ),
        (
            "verdict ignored while the parent is listed",
            World::new(&[("p", "I")])
                .synced(&["p"])
                .running(&["p"])
                .verdict("p", GcVerdict::RemoveNow),
            expect(&[], &[], &[], &[]),
            Inactive,
        ),
        // Writes.
        (
            "new parent: write, do not start",
            World::new(&[]).synced(&["p"]).desired(&[("p", "h1")]),
            expect(&["p"], &[], &[], &[]),
            Inactive,
        ),
        (
            "changed parent: rewrite",
            World::new(&[("p", "I")])
                .synced(&["p"])
                .running(&["p"])
                .desired(&[("p", "h2")]),
            expect(&["p"], &[], &[], &[]),
            Inactive,
        ),
        (
            "unchanged parent: nothing",
            World::new(&[("p", "I")])
                .synced(&["p"])
                .running(&["p"])
                .desired(&[("p", "h1")]),
            expect(&[], &[], &[], &[]),
            Inactive,
        ),
        (
            "active checkpoint keeps running its spec while the new one is written",
            World::new(&[("p", "IA")]).synced(&["p"]).desired(&[("p", "h2")]),
            expect(&["p"], &[], &[], &[]),
            Active,
        ),
        (
            "desired but not listed: no write",
            World::new(&[]).synced(&[]).desired(&[("p", "h1")]),
            expect(&[], &[], &[], &[]),
            Inactive,
        ),
    ];
    for (what, world, expected, state) in cases {
        let p = world.plan(NOW);
        expect_plan(&p, &expected, || what.to_owned());
        if !p.writes.is_empty() || !world.disk.is_empty() {
            assert_eq!(p.states.get(&id("p")), Some(&state), "{what}");
        }
    }
}

#[test]
fn self_is_always_active_and_follows_its_spec() {
    check(
        &World::new(&[("pc-abc", "I")])
            .synced(&["pc-abc"])
            .running(&["pc-abc"]),
        expect(&[], &[], &["pc-abc"], &[]),
        &[("pc-abc", SelfActive)],
    );
    check(
        &World::new(&[("pc-abc", "IA")])
            .synced(&["pc-abc"])
            .running(&["pc-abc"]),
        expect(&[], &[], &[], &[]),
        &[("pc-abc", SelfActive)],
    );
    check(
        &World::new(&[("pc-abc", "IA*")]).running(&["pc-abc"]),
        expect(&[], &[], &["pc-abc"], &[]),
        &[("pc-abc", SelfActive)],
    );
    check(
        &World::new(&[("pc-abc", "IA")])
            .synced(&["pc-abc"])
            .desired(&[("pc-abc", "h2")]),
        expect(&["pc-abc"], &[], &["pc-abc"], &[]),
        &[("pc-abc", SelfActive)],
    );
    // The first pass of a fresh node: write and start itself in one go.
    check(
        &World::new(&[]).synced(&["pc-abc"]).desired(&[("pc-abc", "h1")]),
        expect(&["pc-abc"], &[], &["pc-abc"], &[]),
        &[("pc-abc", SelfActive)],
    );
    // The static copy names itself `<name>-<node>` and still recognises its checkpoint.
    let mut w = World::new(&[("pc-abc", "I")]).local_unknown();
    w.me = SelfIdentity::new(NS, "pc-abc-node-1", "node-1");
    check(&w, expect(&[], &[], &["pc-abc"], &[]), &[("pc-abc", SelfActive)]);
}

#[test]
fn self_gc_removes_everything_then_itself() {
    // Self-GC needs a read saying the agent's DaemonSet is deleted (issue 36: an unknown
    // scheduling, the tests' default, never self-GCs); with no grace period it is due at
    // once.
    let mut base = World::new(&[("pc-abc", "IA"), ("zz", "I"), ("api", "IA"), ("etcd", "I")])
        .synced(&["api", "etcd", "zz"]);
    base.scheduling = SelfScheduling::Deleted;
    // Pending (within the grace period): nothing happens yet.
    let mut pending = base.clone();
    pending.grace = Duration::from_millis(1);
    let p = check(&pending, expect(&[], &[], &[], &[]), &[("pc-abc", SelfActive)]);
    assert_eq!(p.self_gc_at, Some(Timestamp(NOW.0 + 1)));
    // Due: every other checkpoint, sorted, then self; nothing written any more.
    let p = check(
        &base.clone().desired(&[("api", "h2")]),
        Expect {
            removes: vec!["api", "etcd", "zz", "pc-abc"],
            self_gc: true,
            ..Expect::default()
        },
        &[("api", Removed), ("pc-abc", Removed)],
    );
    assert!(
        p.removes
            .iter()
            .all(|r| matches!(r.reason, RemovalReason::SelfGc(_)))
    );
    assert!(p.state.absent_since.is_empty());
    // Never on a view that is not synced.
    for api in [ApiView::Unreachable, ApiView::Reachable] {
        let w = base
            .clone()
            .api(api)
            .running(&["etcd", "zz"])
            .verdict("pc-abc", GcVerdict::RemoveNow);
        check(&w, expect(&[], &[], &[], &[]), &[("pc-abc", SelfActive)]);
    }
}

#[test]
fn bug1_self_never_enters_stop_all() {
    // bootkube: self in active-GP, then the API went down while it ran → `inactive` →
    // every pass stopped every checkpoint and returned early, forever.
    let mut w = World::new(&[("pc-abc", "IA"), ("api", "I")])
        .synced(&[])
        .verdict("pc-abc", GcVerdict::RemoveAt(Timestamp(NOW.0 + 5_000)));
    w.apply(&w.plan(NOW));
    let w = w.api(ApiView::Unreachable).running(&["pc-abc"]);
    let p = check(
        &w,
        expect(&[], &[], &["api"], &[]),
        &[("pc-abc", SelfActive), ("api", Active)],
    );
    assert!(!p.stops.iter().any(|s| &*s.name == "pc-abc"));
    // And its pod coming back to the API keeps it self, not inactive.
    let w = w.synced(&["pc-abc"]);
    check(&w, expect(&[], &[], &[], &[]), &[("pc-abc", SelfActive)]);
}

#[test]
fn bug2_no_resurrection_of_kubelet_only_parents() {
    // A parent only the (stale) kubelet still lists is never written; its old checkpoint
    // is collected and does not come back on the next pass.
    let mut w = World::new(&[("stale", "I")])
        .synced(&[])
        .verdict("stale", GcVerdict::RemoveNow);
    w.local = LocalView::Known {
        running: BTreeSet::new(),
        containers: BTreeMap::new(),
        kubelet_parents: [id("stale")].into(),
        restarts: BTreeMap::new(),
    };
    let p = check(&w, expect(&[], &[], &[], &["stale"]), &[("stale", Removed)]);
    w.apply(&p);
    w.verdicts.clear();
    check(&w, expect(&[], &[], &[], &[]), &[]);
    assert!(w.disk.is_empty());
}

#[test]
fn bug3_self_gc_removes_checkpoints_that_were_never_activated() {
    // bootkube skipped `none`-state entries on remove-all and left their files behind.
    // The agent's DaemonSet read as deleted: an unknown scheduling never self-GCs (issue 36).
    let mut w = World::new(&[("pc-abc", "IA"), ("never-started", "I")]).synced(&["never-started"]);
    w.scheduling = SelfScheduling::Deleted;
    check(
        &w,
        Expect {
            removes: vec!["never-started", "pc-abc"],
            self_gc: true,
            ..Expect::default()
        },
        &[],
    );
}

#[test]
fn bug4_unknown_runtime_never_activates_with_api_up() {
    // bootkube: a CRI error gave a nil running-map, so every parent looked dead and
    // every checkpoint whose parent the API listed was activated.
    let w = World::new(&[("a", "I"), ("b", "I"), ("c", "IA")])
        .synced(&["a", "b", "c"])
        .local_unknown();
    check(
        &w,
        expect(&[], &[], &[], &[]),
        &[("a", Inactive), ("b", Inactive), ("c", Active)],
    );
}

#[test]
fn bug7_grace_deadline_survives_restart() {
    // bootkube kept grace timers in memory only. Here the first sighting of an absent
    // parent is persisted and reused by the next process.
    let w = World::new(&[("p", "I")]).synced(&[]);
    let first = w.plan(NOW);
    let since = first.state.absent_since.get(&id("p")).copied();
    assert_eq!(since, Some(NOW));
    let journal = serde_json::to_string(&first.state).expect("serializes");
    let restored: PersistentState = serde_json::from_str(&journal).expect("parses");
    let mut after_restart = w.clone();
    after_restart.state = restored;
    let later = Timestamp(NOW.0 + 30_000);
    let orphans = orphans(&after_restart.inputs(), later);
    assert_eq!(
        orphans.iter().map(|o| o.absent_since).collect::<Vec<_>>(),
        vec![NOW]
    );
    // The parent back before the deadline clears it.
    let back = after_restart.synced(&["p"]);
    assert!(back.plan(later).state.absent_since.is_empty());
    // An outage neither sets nor clears it.
    let mut down = w.api(ApiView::Unreachable);
    down.state = first.state.clone();
    assert_eq!(down.plan(later).state, first.state);
}

#[test]
fn namespace_removed_from_the_allow_list() {
    // ARCHITECTURE.md, Planner rules: its parents are invisible now (neither listed nor
    // seen running), so nothing of it may start; an active one may be serving right now
    // and stays until its parent is seen running; the rest goes on a synced view.
    let cases = [
        // Outage: never activated (its parent may well run: we no longer look).
        (World::new(&[("a", "I")]), expect(&[], &[], &[], &[]), Inactive),
        (World::new(&[("a", "IA")]), expect(&[], &[], &[], &[]), Active),
        // Synced: the inactive copy goes at once, whatever the strategy would say.
        (
            World::new(&[("a", "I")]).synced(&[]),
            expect(&[], &[], &[], &["a"]),
            Removed,
        ),
        (
            World::new(&[("a", "I")])
                .synced(&[])
                .verdict("a", GcVerdict::Keep),
            expect(&[], &[], &[], &["a"]),
            Removed,
        ),
        // An active one is kept, never offered to the strategy, until its parent runs.
        (
            World::new(&[("a", "IA")])
                .synced(&[])
                .verdict("a", GcVerdict::RemoveNow),
            expect(&[], &[], &[], &[]),
            Active,
        ),
        (
            World::new(&[("a", "IA")]).synced(&[]).local_unknown(),
            expect(&[], &[], &[], &[]),
            Active,
        ),
        (
            World::new(&[("a", "IA")]).synced(&[]).running(&["a"]),
            expect(&[], &[], &[], &["a"]),
            Removed,
        ),
        (
            World::new(&[("a", "IA")]).api(ApiView::Reachable).running(&["a"]),
            expect(&[], &["a"], &[], &[]),
            Inactive,
        ),
        (
            World::new(&[("a", "IA")]).running(&["a"]),
            expect(&[], &["a"], &[], &[]),
            Inactive,
        ),
    ];
    for (world, expected, state) in cases {
        let w = world.namespace_removed();
        check(&w, expected, &[("a", state)]);
        assert!(orphans(&w.inputs(), NOW).is_empty(), "not orphans: {w:#?}");
        assert!(w.plan(NOW).state.absent_since.is_empty());
    }
    // The agent's own checkpoint is not subject to it.
    let w = World::new(&[("pc-abc", "I")]).namespace_removed();
    check(&w, expect(&[], &[], &["pc-abc"], &[]), &[("pc-abc", SelfActive)]);
}

#[test]
fn completed_parents_are_never_activated() {
    // A static copy of a finished Job pod would run its work again, at every reboot.
    let cases = [
        // Not checkpointed; an existing checkpoint goes at once, active or not.
        (
            World::new(&[]).synced(&["j"]).desired(&[("j", "h1")]),
            expect(&[], &[], &[], &[]),
        ),
        (
            World::new(&[("j", "I")]).synced(&["j"]).desired(&[("j", "h2")]),
            expect(&[], &[], &[], &["j"]),
        ),
        (
            World::new(&[("j", "IA")]).synced(&["j"]),
            expect(&[], &[], &[], &["j"]),
        ),
        (
            World::new(&[("j", "I")])
                .synced(&["j"])
                .verdict("j", GcVerdict::Keep),
            expect(&[], &[], &[], &["j"]),
        ),
    ];
    for (world, expected) in cases {
        let w = world.completed(&["j"]);
        let p = check(&w, expected, &[]);
        assert!(orphans(&w.inputs(), NOW).is_empty());
        assert!(p.state.absent_since.is_empty());
        assert!(p.states.get(&id("j")).is_none_or(|s| *s == Removed));
    }
    // A parent that has not completed is checkpointed as ever.
    let w = World::new(&[]).synced(&["j"]).desired(&[("j", "h1")]);
    check(&w, expect(&["j"], &[], &[], &[]), &[("j", Inactive)]);
}

#[test]
fn absent_since_is_never_later_than_now() {
    // A journal written before the clock went back (or a corrupted one) must not
    // postpone garbage collection to a time that never comes: the clock restarts now.
    let check = |previous: i64, synced: bool, expected: Option<Timestamp>| {
        let mut w = World::new(&[("p", "I")]);
        if synced {
            w = w.synced(&[]);
        }
        w.state.absent_since.insert(id("p"), Timestamp(previous));
        assert_eq!(
            w.plan(NOW).state.absent_since.get(&id("p")).copied(),
            expected,
            "{previous} synced={synced}"
        );
        if synced {
            let orphans = orphans(&w.inputs(), NOW);
            assert_eq!(orphans.first().map(|o| o.absent_since), expected, "{previous}");
        }
    };
    for synced in [true, false] {
        check(NOW.0 - 5_000, synced, Some(Timestamp(NOW.0 - 5_000)));
        check(NOW.0, synced, Some(NOW));
        check(NOW.0 + 5_000, synced, Some(NOW));
        check(i64::MAX, synced, Some(NOW));
        check(i64::MIN, synced, Some(Timestamp(i64::MIN)));
    }
}

#[test]
fn bug7_unchanged_checkpoint_not_rewritten() {
    let mut w = World::new(&[])
        .synced(&["p"])
        .running(&["p"])
        .desired(&[("p", "h1")]);
    let p = w.plan(NOW);
    assert_eq!(names(&p.writes), vec!["p"]);
    w.apply(&p);
    assert!(w.plan(Timestamp(NOW.0 + 60_000)).is_noop());
}

#[test]
fn bug8_actions_are_sorted() {
    let mut names_in: Vec<String> = (0..40).map(|i| format!("p{}", (i * 7919) % 97)).collect();
    names_in.dedup();
    let disk: Vec<(&str, &str)> = names_in.iter().map(|n| (n.as_str(), "I")).collect();
    let p = World::new(&disk).plan(NOW);
    let mut sorted = p.starts.clone();
    sorted.sort();
    assert_eq!(p.starts, sorted);
    assert_eq!(p.starts.len(), disk.len());
}

#[test]
fn bug12_daemonset_rolling_update_does_not_self_gc() {
    // The agent's DaemonSet rolls: pc-abc is replaced by pc-xyz (same owner). bootkube's
    // old static copy waited out the grace period, then removed every checkpoint.
    let mut w = World::new(&[("pc-abc", "IA"), ("api", "I")])
        .synced(&["pc-xyz", "api"])
        .running(&["api"])
        .desired(&[("pc-xyz", "h1"), ("api", "h1")])
        .verdict("pc-abc", GcVerdict::RemoveNow);
    // Pass 1: the new pod is checkpointed and started; the old one stays meanwhile.
    let p = check(
        &w,
        expect(&["pc-xyz"], &[], &["pc-xyz"], &[]),
        &[("pc-abc", SelfActive), ("pc-xyz", SelfActive)],
    );
    w.apply(&p);
    // Pass 2: the old one is superseded, removed last, and no self-GC happens.
    let p = check(
        &w,
        expect(&[], &[], &[], &["pc-abc"]),
        &[("pc-abc", Removed), ("api", Inactive)],
    );
    assert_eq!(p.removes[0].reason, RemovalReason::SupersededSelf(id("pc-xyz")));
    w.apply(&p);
    assert!(w.plan(NOW).is_noop());
    assert_eq!(
        w.disk.keys().map(|i| &*i.name).collect::<Vec<_>>(),
        vec!["api", "pc-xyz"]
    );
}

#[test]
fn an_older_self_checkpoint_stays_until_its_successor_is_active() {
    // The rolled pod's checkpoint is stored but its static copy never reached the
    // kubelet (the start failed): removing the old one would leave the node without a
    // static copy of the agent. It is started again, and the old one stays.
    let w = World::new(&[("pc-abc", "IA"), ("pc-xyz", "I")])
        .synced(&["pc-xyz"])
        .desired(&[("pc-xyz", "h1")])
        .verdict("pc-abc", GcVerdict::RemoveNow);
    check(
        &w,
        expect(&[], &[], &["pc-xyz"], &[]),
        &[("pc-abc", SelfActive), ("pc-xyz", SelfActive)],
    );
}

#[test]
fn orphans_are_reported_with_their_owner_and_self_flag() {
    let w = World::new(&[("pc-abc", "IA"), ("api", "I"), ("listed", "I")]).synced(&["listed"]);
    let got: Vec<(String, bool, Timestamp)> = orphans(&w.inputs(), NOW)
        .into_iter()
        .map(|o| (o.id.name.to_string(), o.is_self, o.absent_since))
        .collect();
    assert_eq!(
        got,
        vec![("api".into(), false, NOW), ("pc-abc".into(), true, NOW)]
    );
    assert!(orphans(&w.clone().api(ApiView::Reachable).inputs(), NOW).is_empty());
}

// ---- properties ----

fn arb_world() -> impl Strategy<Value = World> {
    let names = prop::sample::subsequence(vec!["a", "b", "c", "pc-abc", "pc-xyz"], 0..=5);
    let codes = prop::collection::vec(prop::sample::select(vec!["I", "A", "IA", "IA*"]), 5);
    let api = prop::sample::select(vec![0u8, 1, 2]);
    let listed = prop::collection::vec(any::<bool>(), 5);
    let running = prop::collection::vec(prop::option::of(any::<bool>()), 5);
    let desired = prop::collection::vec(prop::option::of(prop::sample::select(vec!["h1", "h2"])), 5);
    let verdicts = prop::collection::vec(prop::sample::select(vec![0u8, 1, 2, 3, 4]), 5);
    let local_known = any::<bool>();
    // Unknown never self-GCs (issue 36); a deleted DaemonSet (no grace period) does.
    let deleted = any::<bool>();
    (
        names,
        codes,
        api,
        listed,
        running,
        desired,
        verdicts,
        local_known,
        deleted,
    )
        .prop_map(
            |(names, codes, api, listed, running, desired, verdicts, local_known, deleted)| {
                let all = ["a", "b", "c", "pc-abc", "pc-xyz"];
                let disk: Vec<(&str, &str)> = names.iter().zip(&codes).map(|(n, c)| (*n, *c)).collect();
                let mut w = World::new(&disk);
                let listed: Vec<&str> = all
                    .iter()
                    .zip(&listed)
                    .filter(|(_, l)| **l)
                    .map(|(n, _)| *n)
                    .collect();
                w = match api {
                    0 => w.api(ApiView::Unreachable),
                    1 => w.api(ApiView::Reachable),
                    _ => w.synced(&listed),
                };
                let running_names: Vec<&str> = all
                    .iter()
                    .zip(&running)
                    .filter(|(_, r)| **r == Some(true))
                    .map(|(n, _)| *n)
                    .collect();
                w = if local_known {
                    w.running(&running_names)
                } else {
                    w.local_unknown()
                };
                let desired: Vec<(&str, &str)> = all
                    .iter()
                    .zip(&desired)
                    .filter_map(|(n, h)| h.map(|h| (*n, h)))
                    .collect();
                w = w.desired(&desired);
                for (n, v) in all.iter().zip(verdicts) {
                    let verdict = match v {
                        0 => continue,
                        1 => GcVerdict::Keep,
                        2 => GcVerdict::RemoveNow,
                        3 => GcVerdict::RemoveAt(NOW),
                        _ => GcVerdict::RemoveAt(NOW.saturating_add(Duration::from_secs(60))),
                    };
                    w = w.verdict(n, verdict);
                }
                if deleted {
                    w.scheduling = SelfScheduling::Deleted;
                }
                w
            },
        )
}

proptest! {
    #[test]
    fn gather_is_the_union_with_every_entry(
        on_disk in prop::collection::btree_set("[a-e]{1,2}", 0..8),
        desired in prop::collection::btree_set("[a-e]{1,2}", 0..8),
        listed in prop::option::of(prop::collection::btree_set("[a-e]{1,2}", 0..8)),
    ) {
        let disk: BTreeMap<PodId, DiskCheckpoint> =
            on_disk.iter().map(|n| (id(n), DiskCheckpoint { inactive: None, active: None })).collect();
        let desired: BTreeMap<PodId, String> = desired.iter().map(|n| (id(n), format!("h-{n}"))).collect();
        let parents: Option<BTreeMap<PodId, ApiParent>> = listed.map(|l| {
            l.iter()
                .map(|n| (id(n), ApiParent { uid: Some(format!("uid-{n}")), owner: None, completed: false, retires_when_ready: false, template_generation: None }))
                .collect()
        });
        let gathered: Vec<Gathered<'_>> = gather(&disk, &desired, parents.as_ref()).collect();
        let expected: BTreeSet<&PodId> =
            disk.keys().chain(desired.keys()).chain(parents.iter().flat_map(|p| p.keys())).collect();
        let ids: Vec<&PodId> = gathered.iter().map(|g| g.id).collect();
        prop_assert_eq!(ids, expected.into_iter().collect::<Vec<_>>());
        for g in &gathered {
            prop_assert_eq!(g.disk.is_some(), disk.contains_key(g.id));
            prop_assert_eq!(g.desired, desired.get(g.id));
            prop_assert_eq!(g.parent, parents.as_ref().and_then(|p| p.get(g.id)));
        }
    }

    #[test]
    fn orphans_are_the_unlisted_checkpoints_of_allowed_namespaces_or_self(w in arb_world()) {
        let found = orphans(&w.inputs(), NOW);
        let expected: Vec<&PodId> = match &w.api {
            ApiView::Synced { parents } => w
                .disk
                .keys()
                .filter(|id| !parents.contains_key(*id))
                .filter(|id| w.allowed.allows(&id.namespace) || id.name.starts_with("pc-"))
                .collect(),
            _ => Vec::new(),
        };
        prop_assert_eq!(found.iter().map(|o| &o.id).collect::<Vec<_>>(), expected);
        for orphan in &found {
            let previous = w.state.absent_since.get(&orphan.id).copied();
            prop_assert_eq!(orphan.absent_since, previous.map_or(NOW, |t| t.min(NOW)));
            prop_assert_eq!(orphan.is_self, orphan.id.name.starts_with("pc-"));
        }
    }

    #[test]
    fn nothing_is_removed_unless_synced(w in arb_world()) {
        let p = w.plan(NOW);
        if !matches!(w.api, ApiView::Synced { .. }) {
            prop_assert!(p.removes.is_empty());
            prop_assert!(!p.self_gc);
            prop_assert!(p.writes.is_empty());
        }
    }

    #[test]
    fn self_is_never_stopped_and_removed_last(w in arb_world()) {
        let p = w.plan(NOW);
        // The world gives every `pc-` pod the agent's DaemonSet as owner.
        let is_self = |i: &PodId| i.name.starts_with("pc-");
        prop_assert!(!p.stops.iter().any(is_self));
        let first_self = p.removes.iter().position(|r| is_self(&r.id));
        if let Some(first) = first_self {
            prop_assert!(p.removes[first..].iter().all(|r| is_self(&r.id)), "self removed before others: {:?}", p.removes);
            let by_self_gc = p.removes[first..].iter().all(|r| matches!(r.reason, RemovalReason::SelfGc(_) | RemovalReason::SupersededSelf(_)));
            prop_assert!(by_self_gc);
        }
        if p.self_gc {
            prop_assert_eq!(p.removes.len(), w.disk.len(), "self-GC removes every checkpoint");
            prop_assert!(p.writes.is_empty() && p.starts.is_empty() && p.stops.is_empty());
        }
    }

    #[test]
    fn plans_are_deterministic_sorted_and_converge(w in arb_world()) {
        let p = w.plan(NOW);
        prop_assert_eq!(&p, &w.plan(NOW));
        for list in [&p.writes, &p.stops, &p.starts] {
            let mut sorted = list.clone();
            sorted.sort();
            sorted.dedup();
            prop_assert_eq!(list, &sorted);
        }
        // Applying a plan and planning again never repeats an action, and the same
        // observations reach a fixpoint within three passes.
        let mut w2 = w.clone();
        w2.apply(&p);
        let again = w2.plan(NOW);
        for (a, b) in [(&p.writes, &again.writes), (&p.stops, &again.stops), (&p.starts, &again.starts)] {
            prop_assert!(a.iter().all(|x| !b.contains(x)), "repeated action: {:?} then {:?}", p, again);
        }
        w2.apply(&again);
        let third = w2.plan(NOW);
        w2.apply(&third);
        prop_assert!(w2.plan(NOW).is_noop(), "no fixpoint: {:#?}", w2);
    }

    /// What `at_stake` promises the slow idle probe: while nothing is at stake, losing
    /// the API starts no checkpoint but the agent's own (a refresh), so seeing the loss
    /// late changes nothing on the node.
    #[test]
    fn nothing_starts_on_an_outage_unless_at_stake(w in arb_world()) {
        let p = w.plan(NOW);
        if !p.at_stake {
            let mut applied = w.clone();
            applied.apply(&p);
            let outage = applied.api(ApiView::Unreachable).plan(NOW);
            prop_assert!(
                outage.starts.iter().all(|id| id.name.starts_with("pc-")),
                "not at stake, yet an outage starts {:?}", outage.starts
            );
        }
    }

    #[test]
    fn every_removal_leaves_no_file(w in arb_world()) {
        let p = w.plan(NOW);
        let mut after = w.clone();
        after.apply(&p);
        for r in &p.removes {
            prop_assert!(!after.disk.contains_key(&r.id));
            prop_assert!(!p.starts.contains(&r.id) && !p.stops.contains(&r.id) && !p.writes.contains(&r.id));
        }
    }
}

/// Self-GC follows the agent's own DaemonSet, not its pod: a rollout, an eviction or a
/// controller outage (own pod absent, DaemonSet still targeting the node) never removes
/// anything, whatever the strategy. Issue 36's rule: only positive evidence removes, so
/// only a successful read saying deleted or descheduled self-GCs, never sooner than the
/// grace period after the first such read (journalled); an unknown scheduling (a failed
/// read, a Node 404, an unknown or non-DaemonSet controller) keeps everything.
#[test]
fn self_gc_follows_the_daemon_sets_scheduling() {
    use SelfScheduling::{Deleted, Descheduled, Targeted, Unknown};
    const GRACE: Duration = Duration::from_secs(60);
    let ago = |secs: i64| Timestamp(NOW.0 - secs * 1000);
    let everything = || Expect {
        removes: vec!["api", "pc-abc"],
        self_gc: true,
        ..Expect::default()
    };
    // `since`: how long ago a read first said deleted or descheduled (the journal).
    let world = |scheduling: SelfScheduling, verdict: Option<GcVerdict>, absent: i64, since: Option<i64>| {
        let mut w = World::new(&[("pc-abc", "IA"), ("api", "IA")]).synced(&["api"]);
        w.scheduling = scheduling;
        w.grace = GRACE;
        w.state.absent_since.insert(id("pc-abc"), ago(absent));
        w.state.self_gc_since = since.map(ago);
        match verdict {
            Some(v) => w.verdict("pc-abc", v),
            None => w,
        }
    };
    let unknown = || Unknown("cannot read the DaemonSet".into());
    // (case, world, expected, self_gc_at, the journal's self_gc_since after the pass)
    type Case<'a> = (&'a str, World, Expect<'a>, Option<Timestamp>, Option<Timestamp>);
    let cases: Vec<Case<'_>> = vec![
        (
            "targeted, immediate strategy (a rollout with maxUnavailable): keep everything",
            world(Targeted, Some(GcVerdict::RemoveNow), 600, None),
            Expect::default(),
            None,
            None,
        ),
        (
            "targeted again: a read saying so resets the clock",
            world(Targeted, None, 600, Some(30)),
            Expect::default(),
            None,
            None,
        ),
        // Was "descheduled: at once, whatever the strategy": one mistaken edit of the
        // DaemonSet (nodeSelector, affinity, taint) then wiped every control-plane node in
        // a pass (issue 36). Now the grace period after the first read saying so.
        (
            "descheduled, first read: not before the grace period, whatever the strategy",
            world(
                Descheduled("nodeSelector".into()),
                Some(GcVerdict::RemoveNow),
                600,
                None,
            ),
            Expect::default(),
            Some(NOW.saturating_add(GRACE)),
            Some(NOW),
        ),
        (
            "descheduled for less than the grace period: not yet",
            world(
                Descheduled("nodeSelector".into()),
                Some(GcVerdict::Keep),
                600,
                Some(59),
            ),
            Expect::default(),
            Some(ago(59).saturating_add(GRACE)),
            Some(ago(59)),
        ),
        (
            "descheduled for the grace period: everything, whatever the strategy",
            world(
                Descheduled("nodeSelector".into()),
                Some(GcVerdict::Keep),
                600,
                Some(60),
            ),
            everything(),
            None,
            None,
        ),
        (
            "deleted: not before the grace period after the pod left",
            world(Deleted, Some(GcVerdict::RemoveNow), 30, Some(30)),
            Expect::default(),
            Some(ago(30).saturating_add(GRACE)),
            Some(ago(30)),
        ),
        (
            "deleted, first read, the pod long gone: not before the grace period after the read",
            world(Deleted, None, 600, None),
            Expect::default(),
            Some(NOW.saturating_add(GRACE)),
            Some(NOW),
        ),
        (
            "deleted: after the grace period",
            world(Deleted, None, 60, Some(60)),
            everything(),
            None,
            None,
        ),
        (
            "a clock later than now (the clock went back) restarts at now",
            world(Deleted, None, 60, Some(-30)),
            Expect::default(),
            Some(NOW.saturating_add(GRACE)),
            Some(NOW),
        ),
        // Was "unknown: due and past the grace period → everything": one failed
        // DaemonSet or Node GET (timeout, 5xx, 429, a 403 after an RBAC change) a minute
        // after the own pod vanished removed every checkpoint, active ones included.
        // Issue 36's rule: a failed observation keeps the last safe state.
        (
            "unknown, the strategy's verdict due and past the grace period: keep everything",
            world(unknown(), Some(GcVerdict::RemoveNow), 600, None),
            Expect::default(),
            None,
            None,
        ),
        (
            "unknown: a clock started by an earlier read is neither reset nor fired",
            world(unknown(), Some(GcVerdict::RemoveNow), 600, Some(600)),
            Expect::default(),
            None,
            Some(ago(600)),
        ),
        (
            "unknown (this node's Node is not registered, a 404): keep everything",
            world(
                Unknown("this node's Node object does not exist".into()),
                Some(GcVerdict::RemoveNow),
                600,
                None,
            ),
            Expect::default(),
            None,
            None,
        ),
        (
            "unknown: the strategy keeps",
            world(unknown(), Some(GcVerdict::Keep), 600, None),
            Expect::default(),
            None,
            None,
        ),
    ];
    for (name, w, expected, self_gc_at, since_after) in cases {
        eprintln!("case: {name}");
        let p = check(&w, expected, &[]);
        assert_eq!(p.self_gc_at, self_gc_at, "{name}");
        assert_eq!(p.state.self_gc_since, since_after, "{name}: the journal's clock");
    }
    // A view that is not synced reads nothing: the clock stays as it was.
    let w = world(Deleted, None, 600, Some(30)).api(ApiView::Reachable);
    assert_eq!(w.plan(NOW).state.self_gc_since, Some(ago(30)));
}

/// Issue 36: a due self-GC removes every checkpoint except an active one serving a
/// DaemonSet lineage that still targets the node (after a failed handoff it may be the
/// node's only working API server); that one and the agent's own stay, until its pod runs
/// here, its DaemonSet stops targeting the node, or the Node is marked for
/// decommissioning. Before, self-GC removed them all in one pass.
#[test]
fn self_gc_spares_a_serving_copy_of_a_daemon_set_that_targets_the_node() {
    let everything = || Expect {
        removes: vec!["api-0", "api-1", "etcd", "zz", "pc-abc"],
        self_gc: true,
        ..Expect::default()
    };
    let deferred = || Expect {
        removes: vec!["api-0", "etcd", "zz"],
        ..Expect::default()
    };
    // The agent's DaemonSet deleted, no grace: self-GC is due. api-1 serves (active, its
    // listed pod not running here: a failed handoff); api-0 is an older revision; etcd is
    // active too, but no DaemonSet's.
    let base = || {
        let mut w = World::new(&[
            ("pc-abc", "IA"),
            ("api-0", "I"),
            ("api-1", "IA"),
            ("etcd", "IA"),
            ("zz", "I"),
        ])
        .synced(&["api-1", "zz"])
        .desired(&[("api-1", "h1"), ("zz", "h2")]);
        w.scheduling = SelfScheduling::Deleted;
        w.live.insert(api_lineage("uid-kube-apiserver"));
        w
    };
    // (case, world, expected, deferred after the pass)
    let cases: Vec<(&str, World, Expect<'_>, Vec<&str>)> = vec![
        (
            "the lineage targets the node and no pod of it runs here: it and self stay",
            base(),
            deferred(),
            vec!["api-1"],
        ),
        (
            "the runtime cannot tell whether it runs: it stays",
            base().local_unknown(),
            deferred(),
            vec!["api-1"],
        ),
        (
            "its pod runs here: everything goes",
            base().running(&["api-1"]),
            everything(),
            vec![],
        ),
        (
            "its DaemonSet no longer targets the node: everything goes",
            {
                let mut w = base();
                w.live.clear();
                w
            },
            everything(),
            vec![],
        ),
        (
            "the Node is marked for decommissioning: everything goes",
            {
                let mut w = base();
                w.decommissioned = true;
                w
            },
            everything(),
            vec![],
        ),
        (
            "its copy is not active (nothing serves): everything goes",
            {
                let mut w = base();
                w.disk.insert(id("api-1"), on_disk("api-1", "I").1);
                w
            },
            everything(),
            vec![],
        ),
    ];
    for (name, w, expected, deferred_after) in cases {
        eprintln!("case: {name}");
        let p = check(&w, expected, &[]);
        assert_eq!(names(&p.self_gc_deferred), deferred_after, "{name}");
        assert_eq!(
            p.state.self_gc_deferred, p.self_gc_deferred,
            "{name}: journalled for inspect"
        );
        if !deferred_after.is_empty() {
            assert_eq!(p.states.get(&id("api-1")), Some(&Active), "{name}");
            assert_eq!(p.states.get(&id("pc-abc")), Some(&SelfActive), "{name}");
            assert!(p.at_stake, "{name}: an active checkpoint waits for its parent");
            assert!(
                (p.removes.iter()).all(|r| matches!(r.reason, RemovalReason::SelfGc(_)) && !r.is_self),
                "{name}"
            );
        }
    }
    // The next pass, nothing changed: nothing more to do (a fixpoint).
    let mut w = base();
    w.apply(&w.plan(NOW));
    let p = check(&w, Expect::default(), &[("api-1", Active)]);
    assert_eq!(names(&p.self_gc_deferred), ["api-1"]);
}

#[test]
fn at_stake_when_losing_the_api_would_change_this_node() {
    fn check_stake(what: &str, world: World, expected: bool) {
        assert_eq!(world.plan(NOW).at_stake, expected, "{what}: {world:#?}");
    }
    let cases: Vec<(&str, World, bool)> = vec![
        ("nothing on disk", World::new(&[]).synced(&[]), false),
        (
            "the agent's own checkpoint alone: it runs, whatever the API does",
            World::new(&[("pc-abc", "IA")])
                .synced(&["pc-abc"])
                .running(&["pc-abc"]),
            false,
        ),
        (
            "every parent runs here",
            World::new(&[("p", "I"), ("q", "I")])
                .synced(&["p", "q"])
                .running(&["p", "q"]),
            false,
        ),
        (
            "a parent listed but not running here (crashed, being re-created)",
            World::new(&[("p", "I"), ("q", "I")])
                .synced(&["p", "q"])
                .running(&["p"]),
            true,
        ),
        (
            "the runtime cannot say what runs",
            World::new(&[("p", "I")]).synced(&["p"]).local_unknown(),
            true,
        ),
        (
            "an active checkpoint waits for the API and its parent",
            World::new(&[("p", "IA")]),
            true,
        ),
        (
            "the API is gone but every parent runs",
            World::new(&[("p", "I")]).running(&["p"]),
            false,
        ),
        (
            "outside the allow-list, inactive: never activated again",
            World::new(&[("p", "I")]).namespace_removed(),
            false,
        ),
        (
            "outside the allow-list, active, parent not running: it may be serving",
            World::new(&[("p", "IA")]).namespace_removed(),
            true,
        ),
        (
            "a checkpoint written in this pass for a parent that does not run here",
            World::new(&[]).synced(&["p"]).desired(&[("p", "h1")]),
            true,
        ),
    ];
    for (what, world, expected) in cases {
        check_stake(what, world, expected);
    }
}

/// The metrics label's values: every reason has its own code, and `CODES` lists them all.
#[test]
fn removal_codes_are_distinct_and_listed() {
    let reasons = [
        RemovalReason::Gc("parent deleted".into()),
        RemovalReason::SupersededSelf(id("pod-checkpointer-new")),
        RemovalReason::SelfGc("deselected".into()),
        RemovalReason::NotAllowed,
        RemovalReason::Completed,
    ];
    let codes: Vec<&str> = reasons.iter().map(RemovalReason::code).collect();
    assert_eq!(codes, RemovalReason::CODES);
    let distinct: std::collections::BTreeSet<&str> = codes.iter().copied().collect();
    assert_eq!(distinct.len(), codes.len());
}

/// Plans at `secs` after [`NOW`], checks the plan and its handoff steps, and applies it.
fn step(world: &mut World, secs: u64, expected: Expect<'_>, handoffs: &[Handoff]) -> Plan {
    let now = NOW.saturating_add(Duration::from_secs(secs));
    world.clock = now;
    let p = world.plan(now);
    expect_plan(&p, &expected, || format!("at +{secs}s, world: {world:#?}"));
    let steps: Vec<Handoff> = p.handoffs.iter().map(|h| h.2).collect();
    assert_eq!(steps, handoffs, "handoff steps at +{secs}s");
    world.apply(&p);
    p
}

fn proven(world: &mut World, name: &str, hash: &str) {
    let proof = SpecSince {
        spec_hash: hash.into(),
        since: NOW,
    };
    world.state.known_good.insert(id(name), proof);
}

/// The owner-reference strategy's verdict for a superseded revision: remove it now.
fn superseded(world: World, name: &str) -> World {
    world.verdict(name, GcVerdict::RemoveNow)
}

/// Issue 21's scenario in the planner: a self-hosted kube-apiserver (a DaemonSet) is
/// upgraded to a spec that crash-loops; the known-good revision keeps serving through the
/// failed handoff and a power cut; a rollback hands over to the parent.
#[test]
fn a_bad_upgrade_is_served_by_the_known_good_revision_until_a_rollback() {
    use Handoff::{Failed, Ready, Started};
    let mut w = World::new(&[("api-1", "I")]);
    proven(&mut w, "api-1", "h1");
    // The rollout deletes the proven pod: the API is gone, its checkpoint starts.
    step(&mut w, 0, expect(&[], &[], &["api-1"], &[]), &[]);
    // Served by the checkpoint, the API lists the new pod: checkpointed beside the
    // known-good revision, which the strategy's verdict does not remove.
    w = superseded(w.synced(&["api-2"]).desired(&[("api-2", "h2")]), "api-1");
    let p = step(&mut w, 10, expect(&["api-2"], &[], &[], &[]), &[]);
    assert_eq!(p.states[&id("api-1")], Active, "the known-good revision serves");
    assert_eq!(p.states[&id("api-2")], Inactive);
    // The new pod's container runs: it gets the node.
    w = w.running(&["api-2"]);
    let p = step(&mut w, 20, expect(&[], &["api-1"], &[], &[]), &[Started]);
    assert_eq!(p.handoff_at, Some(NOW.saturating_add(Duration::from_secs(140))));
    assert!(p.at_stake);
    // It crashes; the API is gone: the checkpoint waits for the deadline.
    w = w.api(ApiView::Unreachable).running(&[]);
    let p = step(&mut w, 60, expect(&[], &[], &[], &[]), &[]);
    assert_eq!(p.states[&id("api-1")], Inactive);
    // Deadline passed without a Ready parent: the known-good revision returns.
    let p = step(&mut w, 140, expect(&[], &[], &["api-1"], &[]), &[Failed]);
    assert!(p.state.rejected.contains_key(&id("api-2")));
    // It stays while the rejected parent crash-loops, API or not, and across a power cut,
    // until the retry's back-off has passed (5 minutes after the failure).
    w = superseded(w.synced(&["api-2"]).running(&["api-2"]), "api-1");
    let p = step(&mut w, 150, expect(&[], &[], &[], &[]), &[]);
    assert_eq!(p.handoff_at, Some(NOW.saturating_add(Duration::from_secs(440))));
    w = w.api(ApiView::Unreachable).running(&[]);
    step(&mut w, 300, expect(&[], &[], &[], &[]), &[]);
    // Past the back-off, its pod running: it gets the node again (issue 36: it used to be
    // rejected for good, so a parent only slow to start hung the rollout)...
    w = w.running(&["api-2"]);
    step(&mut w, 440, expect(&[], &["api-1"], &[], &[]), &[Started]);
    // ... and fails again: the known-good revision returns, the back-off doubles.
    let p = step(&mut w, 560, expect(&[], &[], &["api-1"], &[]), &[Failed]);
    assert_eq!(p.state.rejected[&id("api-2")].failures, 2);
    let p = step(&mut w, 905, expect(&[], &[], &[], &[]), &[]);
    assert_eq!(p.handoff_at, Some(NOW.saturating_add(Duration::from_secs(1160))));
    // The rollback: a third pod with the old spec. The failed revision goes, the
    // known-good one stays and serves until the new pod runs.
    w = w.synced(&["api-3"]).running(&[]).desired(&[("api-3", "h3")]);
    w = superseded(superseded(w, "api-1"), "api-2");
    let p = step(&mut w, 1000, expect(&["api-3"], &[], &[], &["api-2"]), &[]);
    assert!(
        p.state.rejected.is_empty(),
        "the rejected revision's entry goes with it"
    );
    w = w.running(&["api-3"]);
    step(&mut w, 1010, expect(&[], &["api-1"], &[], &[]), &[Started]);
    // Ready before its deadline: it keeps the node.
    w.ready.insert(id("api-3"));
    let p = step(&mut w, 1030, expect(&[], &[], &[], &[]), &[Ready]);
    assert!(p.state.handoffs.is_empty());
    // A minute later it is known-good (`known_good::track`): the revision an outage runs.
    proven(&mut w, "api-3", "h3");
    w = w.api(ApiView::Unreachable).running(&[]);
    let p = step(&mut w, 1100, expect(&[], &[], &["api-3"], &[]), &[]);
    assert_eq!(
        p.states[&id("api-1")],
        Inactive,
        "kept: the previous known-good revision"
    );
}

/// A parent that binds beside its checkpoint (`when-ready`, e.g. kube-apiserver with
/// `--permit-port-sharing`): the checkpoint stays while the parent runs and is not Ready,
/// API or not, and retires once it is Ready; no handoff, no gap.
#[test]
fn a_checkpoint_stays_until_a_parent_that_binds_beside_it_is_ready() {
    // Without revisions: the outage's checkpoint and the parent back.
    let mut w = World::new(&[("shared-api", "I")]);
    step(&mut w, 0, expect(&[], &[], &["shared-api"], &[]), &[]);
    w = w.running(&["shared-api"]);
    step(&mut w, 10, expect(&[], &[], &[], &[]), &[]);
    w = w.synced(&["shared-api"]);
    let p = step(&mut w, 20, expect(&[], &[], &[], &[]), &[]);
    assert_eq!(
        p.states[&id("shared-api")],
        Active,
        "beside the parent, not Ready yet"
    );
    w.ready.insert(id("shared-api"));
    step(&mut w, 30, expect(&[], &["shared-api"], &[], &[]), &[]);

    // With revisions: a bad upgrade while the known-good revision serves gets no handoff,
    // and the known-good checkpoint never stops; the rollback's pod takes over once Ready.
    let mut w = World::new(&[("shared-1", "I")]);
    proven(&mut w, "shared-1", "h1");
    step(&mut w, 0, expect(&[], &[], &["shared-1"], &[]), &[]);
    w = superseded(w.synced(&["shared-2"]).desired(&[("shared-2", "h2")]), "shared-1");
    step(&mut w, 10, expect(&["shared-2"], &[], &[], &[]), &[]);
    w = w.running(&["shared-2"]);
    let p = step(&mut w, 20, expect(&[], &[], &[], &[]), &[]);
    assert_eq!(p.states[&id("shared-1")], Active);
    assert_eq!(p.handoff_at, None, "no deadline");
    step(&mut w, 500, expect(&[], &[], &[], &[]), &[]);
    w = w.api(ApiView::Unreachable);
    step(&mut w, 510, expect(&[], &[], &[], &[]), &[]);
    w = w
        .synced(&["shared-3"])
        .running(&["shared-3"])
        .desired(&[("shared-3", "h3")]);
    w = superseded(superseded(w, "shared-1"), "shared-2");
    let p = step(&mut w, 600, expect(&["shared-3"], &[], &[], &["shared-2"]), &[]);
    assert_eq!(p.states[&id("shared-1")], Active, "until the new pod is Ready");
    w.ready.insert(id("shared-3"));
    step(&mut w, 610, expect(&[], &["shared-1"], &[], &[]), &[]);
}

#[test]
fn a_parent_being_deleted_gets_no_handoff() {
    let mut w = World::new(&[("api-1", "I")]);
    proven(&mut w, "api-1", "h1");
    step(&mut w, 0, expect(&[], &[], &["api-1"], &[]), &[]);
    w = superseded(w.synced(&["api-2"]).desired(&[("api-2", "h2")]), "api-1");
    step(&mut w, 10, expect(&["api-2"], &[], &[], &[]), &[]);
    // Its DaemonSet replaces it (a rollback) while its container runs: the known-good
    // checkpoint keeps the node.
    w = w.running(&["api-2"]);
    w.terminating.insert(id("api-2"));
    let p = step(&mut w, 20, expect(&[], &[], &[], &[]), &[]);
    assert_eq!(p.states[&id("api-1")], Active);
    // The same pod, not being deleted, gets it.
    w.terminating.clear();
    step(&mut w, 30, expect(&[], &["api-1"], &[], &[]), &[Handoff::Started]);
}

#[test]
fn revisions_off_run_the_newest_as_the_original_did() {
    let mut w = World::new(&[("api-1", "I")]);
    w.revisions.keep = 1;
    proven(&mut w, "api-1", "h1");
    w = superseded(w.synced(&["api-2"]).desired(&[("api-2", "h2")]), "api-1");
    step(&mut w, 10, expect(&["api-2"], &[], &[], &["api-1"]), &[]);
    w = w.api(ApiView::Unreachable);
    step(&mut w, 20, expect(&[], &[], &["api-2"], &[]), &[]);
}

#[test]
fn an_unproven_lineage_runs_its_newest_revision() {
    // Neither revision was ever Ready for a minute: the newest runs, the older one goes by
    // its verdict.
    let mut w = World::new(&[("api-1", "I")]);
    w = superseded(w.synced(&["api-2"]).desired(&[("api-2", "h2")]), "api-1");
    step(&mut w, 10, expect(&["api-2"], &[], &[], &["api-1"]), &[]);
    w = w.api(ApiView::Unreachable);
    step(&mut w, 20, expect(&[], &[], &["api-2"], &[]), &[]);
}

#[test]
fn a_deleted_daemon_set_takes_its_revisions_along() {
    // Nothing of the lineage is listed any more: every revision goes by its verdict.
    let mut w = World::new(&[("api-1", "I"), ("api-2", "I")]);
    proven(&mut w, "api-1", "h1");
    w = superseded(superseded(w.synced(&[]), "api-1"), "api-2");
    step(&mut w, 10, expect(&[], &[], &[], &["api-1", "api-2"]), &[]);
}

#[test]
fn a_parent_of_the_lineage_running_retires_the_known_good_revision_it_proved() {
    // The known-good revision's own parent runs again (the newest is unproven but it is
    // not the one running): the checkpoint steps aside as usual.
    let mut w = World::new(&[("api-1", "IA"), ("api-2", "I")]);
    proven(&mut w, "api-1", "h1");
    w = w.running(&["api-1"]);
    step(&mut w, 10, expect(&[], &["api-1"], &[], &[]), &[]);
}

/// A rollout's old and new pods overlap (the new one waits for a port the old one holds,
/// say) and the old one's Secret is rotated: its checkpoint is rewritten after the new
/// one's. When "newest" was the last write time, the old revision was the newest from then
/// on: every outage ran its content, and while its DaemonSet targets the node it was kept
/// past its verdict for good. The newest is the newest template generation.
#[test]
fn a_rewritten_old_revision_does_not_become_the_newest() {
    let mut w = World::new(&[])
        .synced(&["api-1", "api-2"])
        .generations(&[("api-1", 1), ("api-2", 2)])
        .desired(&[("api-1", "h1"), ("api-2", "h2")]);
    w.live.insert(api_lineage("uid-kube-apiserver"));
    step(&mut w, 0, expect(&["api-1", "api-2"], &[], &[], &[]), &[]);
    // The old pod's Secret rotated: its checkpoint is written again, after the new one's.
    w = w.desired(&[("api-1", "h1b"), ("api-2", "h2")]);
    step(&mut w, 10, expect(&["api-1"], &[], &[], &[]), &[]);
    // An outage: the activation runs the new pod's revision.
    let mut outage = w.clone().api(ApiView::Unreachable);
    step(&mut outage, 20, expect(&[], &[], &["api-2"], &[]), &[]);
    // The old pod is gone: its revision goes by its verdict though its DaemonSet targets
    // the node (it is neither the newest nor known-good).
    w = superseded(w.synced(&["api-2"]).generations(&[("api-2", 2)]), "api-1");
    step(&mut w, 20, expect(&[], &[], &[], &["api-1"]), &[]);
}

/// The `kube-apiserver` DaemonSet's lineage (the owner [`owner_of`] gives `api-*` pods).
fn api_lineage(uid: &str) -> Lineage {
    Lineage::DaemonSet {
        namespace: NS.into(),
        uid: uid.into(),
    }
}

#[test]
fn a_lineage_stays_while_its_daemon_set_targets_the_node() {
    // Nothing of the lineage is listed, and the strategy says remove every revision now.
    let live = Some("uid-kube-apiserver");
    /// (what, disk, live lineage's UID, revisions kept, removed, the state of api-1 after)
    type Case<'a> = (
        &'a str,
        &'a [(&'a str, &'a str)],
        Option<&'a str>,
        usize,
        &'a [&'a str],
        CheckpointState,
    );
    let cases: [Case<'_>; 6] = [
        (
            "a rollout deleted the pod before creating the next: the serving checkpoint stays",
            &[("api-1", "IA")],
            live,
            2,
            &[],
            Active,
        ),
        (
            "the DaemonSet no longer targets the node (or is gone): the strategy decides",
            &[("api-1", "IA")],
            None,
            2,
            &["api-1"],
            Removed,
        ),
        (
            "a re-created DaemonSet of the same name is another lineage",
            &[("api-1", "IA")],
            Some("uid-other"),
            2,
            &["api-1"],
            Removed,
        ),
        (
            "a rollback deleted the rejected pod: the known-good revision keeps serving",
            &[("api-1", "IA"), ("api-2", "I")],
            live,
            2,
            &[],
            Active,
        ),
        (
            "revisions off: the newest is kept, the older one goes",
            &[("api-1", "IA"), ("api-2", "I")],
            live,
            1,
            &["api-1"],
            Removed,
        ),
        (
            "revisions past the ones kept go by their verdicts",
            &[("api-0", "I"), ("api-1", "IA"), ("api-2", "I")],
            live,
            2,
            &["api-0"],
            Active,
        ),
    ];
    for (what, disk, uid, keep, removed, state) in cases {
        let mut w = World::new(disk).synced(&[]).running(&[]);
        w.revisions.keep = keep;
        proven(&mut w, "api-1", "h1");
        for (name, _) in disk {
            w = w.verdict(name, GcVerdict::RemoveNow);
        }
        w.live.extend(uid.map(api_lineage));
        // Newer names were checkpointed later.
        for (n, (_, d)) in w.disk.iter_mut().enumerate() {
            for c in d.inactive.iter_mut().chain(d.active.iter_mut()) {
                c.meta.checkpointed_at = Some(Timestamp(n as i64 * 1_000));
            }
        }
        let p = w.plan(NOW);
        expect_plan(&p, &expect(&[], &[], &[], removed), || what.to_owned());
        assert_eq!(p.states[&id("api-1")], state, "{what}");
    }
}

/// Two known-good revisions of a self-hosted kube-apiserver; the newer one, activated by an
/// outage, crash-loops (a file its flags name was on a tmpfs the power cut emptied): the
/// previous known-good revision replaces it, its mark suspended (not dropped: issue 36)
/// while the replacement is on trial; the replacement brings the API back, so the
/// set-aside holds and the mark goes; the parent with the set-aside content takes over
/// through the handoff, as any unproven one.
#[test]
fn an_active_revision_that_crash_loops_is_replaced_by_the_previous_known_good_one() {
    let mut w = two_known_good_revisions();
    // The power cut: the newest known-good revision starts; its restarts are watched.
    let p = step(&mut w, 100, expect(&[], &[], &["api-2"], &[]), &[]);
    assert_eq!(p.watch_restarts, [id("api-2")].into());
    w = w.restarts(&[("api-2", 0)]);
    step(&mut w, 105, expect(&[], &[], &[], &[]), &[]);
    w = w.restarts(&[("api-2", 2)]);
    step(&mut w, 130, expect(&[], &[], &[], &[]), &[]);
    // Three restarts since the first look: set aside, the previous known-good one runs.
    w = w.restarts(&[("api-2", 3)]);
    let p = step(&mut w, 150, expect(&[], &["api-2"], &["api-1"], &[]), &[]);
    let set_aside = SetAside {
        revision: id("api-2"),
        replacement: id("api-1"),
        restarts: 3,
        failed_alike: false,
    };
    assert_eq!(p.set_aside, [set_aside]);
    // Was: its mark dropped at once, on restarts alone.
    assert!(p.state.known_good.contains_key(&id("api-2")), "the mark is kept");
    assert!(p.state.suspended.contains_key(&id("api-2")), "and suspended");
    assert_eq!(
        p.watch_restarts,
        [id("api-1")].into(),
        "the replacement is on trial"
    );
    assert_eq!(p.states[&id("api-2")], Inactive);
    // It crash-loops on: nothing changes; the replacement runs without restarting.
    let p = step(&mut w, 300, expect(&[], &[], &[], &[]), &[]);
    assert!(p.set_aside.is_empty());
    w = w.restarts(&[("api-2", 9), ("api-1", 0)]);
    step(&mut w, 400, expect(&[], &[], &[], &[]), &[]);
    // The replacement brought the API back: it did better, the set-aside holds.
    w = w.api(ApiView::Reachable);
    let p = step(&mut w, 450, expect(&[], &[], &[], &[]), &[]);
    assert!(p.state.suspended.is_empty(), "the trial ended");
    assert!(!p.state.known_good.contains_key(&id("api-2")), "the mark went");
    assert!(p.state.known_good.contains_key(&id("api-1")));
    // The API lists the DaemonSet's pod with the set-aside content: as any unproven parent
    // it gets the node through the handoff.
    w = superseded(w.synced(&["api-2"]).running(&["api-2"]), "api-1");
    step(
        &mut w,
        500,
        expect(&[], &["api-1"], &[], &[]),
        &[Handoff::Started],
    );
}

/// Issue 36, the real node's rollback after a set-aside (stop 42's failure): once the
/// replacement brought the API back, a later outage in which it restarts (a parent holding
/// its port) is not its trial: the set-aside revision, crash-looping, never runs again.
#[test]
fn a_set_aside_that_held_is_not_undone_by_later_restarts() {
    let mut w = api_2_set_aside_after_the_cut();
    w = w.restarts(&[("api-1", 0)]);
    step(&mut w, 155, expect(&[], &[], &[], &[]), &[]);
    // The API is back, served by api-1; api-2's parent runs (crash-looping, never Ready):
    // it gets the node, and the API goes with the checkpoint that served it.
    w = w.synced(&["api-2"]).running(&["api-2"]);
    step(
        &mut w,
        200,
        expect(&[], &["api-1"], &[], &[]),
        &[Handoff::Started],
    );
    w = w.api(ApiView::Unreachable);
    step(&mut w, 250, expect(&[], &[], &[], &[]), &[]);
    // Rejected at the deadline: api-1 serves again, beside the parent that may hold its
    // port, and restarts; that is no trial: nothing is set aside, api-2 is not restored.
    step(&mut w, 330, expect(&[], &[], &["api-1"], &[]), &[Handoff::Failed]);
    w = w.restarts(&[("api-1", 0)]);
    step(&mut w, 335, expect(&[], &[], &[], &[]), &[]);
    w = w.restarts(&[("api-1", 5)]);
    let p = step(&mut w, 400, expect(&[], &[], &[], &[]), &[]);
    assert!(p.set_aside.is_empty());
    assert_eq!(p.states[&id("api-1")], Active);
    assert_eq!(p.states[&id("api-2")], Inactive);
    assert!(p.state.suspended.is_empty());
}

/// Issue 36: after a multi-master power cut kube-apiserver exits until etcd has quorum,
/// so every revision crash-loops alike. The older one run in place of the newest
/// crash-loops too: the newest runs again, its mark holding, and nothing more is set
/// aside in that outage (it used to drop the newest mark and run the older revision with
/// its frozen certificates from then on).
#[test]
fn revisions_that_crash_loop_alike_go_back_to_the_newest() {
    let mut w = api_2_set_aside_after_the_cut();
    w = w.restarts(&[("api-2", 3), ("api-1", 0)]);
    step(&mut w, 155, expect(&[], &[], &[], &[]), &[]);
    // The older one crash-loops as well: back to the newest.
    w = w.restarts(&[("api-2", 3), ("api-1", 3)]);
    let p = step(&mut w, 200, expect(&[], &["api-1"], &["api-2"], &[]), &[]);
    let alike = SetAside {
        revision: id("api-1"),
        replacement: id("api-2"),
        restarts: 3,
        failed_alike: true,
    };
    assert_eq!(p.set_aside, [alike]);
    assert!(p.state.known_good.contains_key(&id("api-1")) && p.state.known_good.contains_key(&id("api-2")));
    assert!(p.state.suspended[&id("api-2")].failed_alike);
    assert!(p.watch_restarts.is_empty(), "nothing more is set aside");
    // It crash-loops on until etcd has quorum: it waits, and runs.
    w = w.restarts(&[("api-2", 20), ("api-1", 3)]);
    let p = step(&mut w, 600, expect(&[], &[], &[], &[]), &[]);
    assert!(p.set_aside.is_empty());
    assert_eq!(p.states[&id("api-2")], Active);
    // Quorum: the API is back, the trial ends, both marks hold.
    w = w.api(ApiView::Reachable);
    let p = step(&mut w, 700, expect(&[], &[], &[], &[]), &[]);
    assert!(p.state.suspended.is_empty());
    assert!(p.state.known_good.contains_key(&id("api-1")) && p.state.known_good.contains_key(&id("api-2")));
    assert_eq!(p.states[&id("api-2")], Active);
}

/// [`two_known_good_revisions`] after a power cut: api-2 activated, three restarts, set
/// aside at +150 s for api-1.
fn api_2_set_aside_after_the_cut() -> World {
    let mut w = two_known_good_revisions();
    step(&mut w, 100, expect(&[], &[], &["api-2"], &[]), &[]);
    w = w.restarts(&[("api-2", 0)]);
    step(&mut w, 105, expect(&[], &[], &[], &[]), &[]);
    w = w.restarts(&[("api-2", 3)]);
    step(&mut w, 150, expect(&[], &["api-2"], &["api-1"], &[]), &[]);
    w
}

/// Two known-good revisions on disk, api-2 the newer.
fn two_known_good_revisions() -> World {
    let dated = |w: &mut World, name: &str, secs: u64| {
        let d = w.disk.get_mut(&id(name)).unwrap();
        d.inactive.as_mut().unwrap().meta.checkpointed_at =
            Some(NOW.saturating_add(Duration::from_secs(secs)));
    };
    let mut w = World::new(&[("api-1", "I"), ("api-2", "I")]);
    dated(&mut w, "api-1", 0);
    dated(&mut w, "api-2", 10);
    proven(&mut w, "api-1", "h1");
    proven(&mut w, "api-2", "h1");
    w
}

/// A revision is set aside only for a known-good one, and only while the API is unreachable.
#[test]
fn a_crash_looping_revision_without_a_fallback_stays() {
    // The known-good revision runs, the newest is unproven: nothing to fall back to.
    let mut w = World::new(&[("api-1", "IA"), ("api-2", "I")]);
    proven(&mut w, "api-1", "h1");
    {
        let d = w.disk.get_mut(&id("api-2")).unwrap();
        d.inactive.as_mut().unwrap().meta.checkpointed_at = Some(NOW);
    }
    w.state
        .restarts_seen
        .insert(id("api-1"), RestartsSeen { first: 0, since: NOW });
    w = w.restarts(&[("api-1", 50)]);
    let p = step(&mut w, 0, expect(&[], &[], &[], &[]), &[]);
    assert!(p.set_aside.is_empty() && p.watch_restarts.is_empty() && p.state.restarts_seen.is_empty());
    assert_eq!(p.states[&id("api-1")], Active);
}

/// The journal was lost (`marks_unknown`): the known-good and rejected marks are gone, so a
/// missing mark proves nothing. Without the flag the newest revision runs and an older one
/// serving (the known-good checkpoint after a failed handoff) stops for a parent that may
/// be the very one rejected. Disk: `api-1` older, `api-2` newest.
#[test]
fn while_the_marks_are_unknown_an_active_older_revision_serves_on() {
    let lost = |disk: &[(&str, &str)]| {
        let mut w = World::new(disk);
        w.state.marks_unknown = true;
        w
    };
    let live = |mut w: World| {
        w.live.insert(api_lineage("uid-kube-apiserver"));
        w
    };
    let ready = |mut w: World, name: &str| {
        w.ready.insert(id(name));
        w
    };
    /// (what, world, expected, states, marks unknown after)
    type Case<'a> = (&'a str, World, Expect<'a>, Vec<(&'a str, CheckpointState)>, bool);
    let cases: Vec<Case<'_>> = vec![
        (
            "the newest parent runs, not Ready: no handoff, the older revision serves on",
            lost(&[("api-1", "IA"), ("api-2", "I")])
                .synced(&["api-2"])
                .running(&["api-2"]),
            expect(&[], &[], &[], &[]),
            vec![("api-1", Active), ("api-2", Inactive)],
            true,
        ),
        (
            "the same with the marks known (an empty journal): the newest runs",
            World::new(&[("api-1", "IA"), ("api-2", "I")])
                .synced(&["api-2"])
                .running(&["api-2"]),
            expect(&[], &["api-1"], &[], &[]),
            vec![("api-1", Inactive), ("api-2", Inactive)],
            false,
        ),
        (
            "the newest parent Ready on a synced view: the older revision steps aside, the \
             marks are known again",
            ready(
                lost(&[("api-1", "IA"), ("api-2", "I")])
                    .synced(&["api-2"])
                    .running(&["api-2"]),
                "api-2",
            ),
            expect(&[], &["api-1"], &[], &[]),
            vec![("api-1", Inactive), ("api-2", Inactive)],
            false,
        ),
        (
            "in an outage the active older revision stays; the newest is not started",
            lost(&[("api-1", "IA"), ("api-2", "I")]),
            expect(&[], &[], &[], &[]),
            vec![("api-1", Active), ("api-2", Inactive)],
            true,
        ),
        (
            "its verdict due while its DaemonSet targets the node: kept, as a known-good \
             revision would be",
            live(
                lost(&[("api-1", "IA"), ("api-2", "I")])
                    .synced(&["api-2"])
                    .running(&["api-2"])
                    .verdict("api-1", GcVerdict::RemoveNow),
            ),
            expect(&[], &[], &[], &[]),
            vec![("api-1", Active)],
            true,
        ),
        (
            "nothing older active: as usual, and a synced pass makes the marks known",
            lost(&[("api-1", "I"), ("api-2", "IA")]).synced(&["api-2"]),
            expect(&[], &[], &[], &[]),
            vec![("api-1", Inactive), ("api-2", Active)],
            false,
        ),
        (
            "nothing older active in an outage: still unknown (nothing proven yet)",
            lost(&[("api-1", "I"), ("api-2", "IA")]),
            expect(&[], &[], &[], &[]),
            vec![("api-2", Active)],
            true,
        ),
    ];
    for (what, world, expected, states, unknown_after) in cases {
        let p = world.plan(NOW);
        expect_plan(&p, &expected, || what.to_owned());
        for (name, state) in states {
            assert_eq!(p.states.get(&id(name)), Some(&state), "{what}: state of {name}");
        }
        assert!(p.handoffs.is_empty(), "{what}: no handoff");
        assert_eq!(
            p.state.marks_unknown, unknown_after,
            "{what}: marks unknown after"
        );
    }
}

/// No revision is set aside while the marks are unknown: the restarts may be the
/// environment's, and which revision is good is what was lost.
#[test]
fn while_the_marks_are_unknown_no_revision_is_set_aside() {
    let mut w = World::new(&[("api-1", "I"), ("api-2", "IA")]);
    // Both proven since the loss: still unknown until a synced pass.
    proven(&mut w, "api-1", "h1");
    proven(&mut w, "api-2", "h1");
    w.state
        .restarts_seen
        .insert(id("api-2"), RestartsSeen { first: 0, since: NOW });
    w = w.restarts(&[("api-2", 50)]);
    let mut known = w.clone();
    w.state.marks_unknown = true;
    let p = step(&mut w, 0, expect(&[], &[], &[], &[]), &[]);
    assert!(p.set_aside.is_empty() && p.watch_restarts.is_empty(), "{p:?}");
    assert!(p.state.known_good.contains_key(&id("api-2")));
    // The same with the marks known: set aside.
    let p = step(&mut known, 0, expect(&[], &["api-2"], &["api-1"], &[]), &[]);
    assert_eq!(p.set_aside.len(), 1);
}
