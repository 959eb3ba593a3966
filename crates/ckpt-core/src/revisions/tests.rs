use super::*;

fn t(secs: i64) -> Timestamp {
    Timestamp(secs * 1000)
}

fn id(name: &str) -> PodId {
    PodId::new("kube-system", name)
}

fn ds(uid: &str) -> Lineage {
    Lineage::DaemonSet {
        namespace: "kube-system".into(),
        uid: uid.into(),
    }
}

/// Revisions as `(lineage uid, name, pod-template-generation, checkpointed at, proven)`;
/// the expected plans as `(lineage uid, newest, runs, kept)`.
#[allow(clippy::type_complexity)]
fn check_lineages(
    what: &str,
    keep: usize,
    revisions: &[(&str, &str, Option<i64>, Option<i64>, bool)],
    expected: &[(&str, &str, &str, &[&str])],
) {
    let ids: Vec<PodId> = revisions.iter().map(|r| id(r.1)).collect();
    let input = (revisions.iter().zip(&ids)).map(|(r, id)| {
        let revision = Revision {
            id,
            generation: r.2,
            checkpointed_at: r.3.map(t),
            proven: r.4,
        };
        (ds(r.0), revision)
    });
    let settings = RevisionSettings {
        keep,
        ..RevisionSettings::default()
    };
    let got = plan_lineages(input, &settings);
    let want: BTreeMap<Lineage, LineagePlan> = (expected.iter())
        .map(|(uid, newest, runs, kept)| {
            let plan = LineagePlan {
                newest: id(newest),
                runs: id(runs),
                kept: kept.iter().map(|n| id(n)).collect(),
            };
            (ds(uid), plan)
        })
        .collect();
    assert_eq!(got, want, "{what}");
}

#[test]
fn lineages() {
    check_lineages(
        "one revision, unproven: it runs",
        2,
        &[("a", "api-1", None, Some(10), false)],
        &[("a", "api-1", "api-1", &["api-1"])],
    );
    check_lineages(
        "a bad upgrade: the known-good one runs, both are kept",
        2,
        &[
            ("a", "api-1", None, Some(10), true),
            ("a", "api-2", None, Some(20), false),
        ],
        &[("a", "api-2", "api-1", &["api-2", "api-1"])],
    );
    check_lineages(
        "the upgrade proved itself: it runs; the previous known-good one is kept",
        2,
        &[
            ("a", "api-1", None, Some(10), true),
            ("a", "api-2", None, Some(20), true),
        ],
        &[("a", "api-2", "api-2", &["api-2", "api-1"])],
    );
    check_lineages(
        "two bad upgrades in a row: the unproven middle one is not kept",
        2,
        &[
            ("a", "api-1", None, Some(10), true),
            ("a", "api-2", None, Some(20), false),
            ("a", "api-3", None, Some(30), false),
        ],
        &[("a", "api-3", "api-1", &["api-3", "api-1"])],
    );
    check_lineages(
        "three kept: the two newest known-good ones beside the newest",
        3,
        &[
            ("a", "api-1", None, Some(10), true),
            ("a", "api-2", None, Some(20), true),
            ("a", "api-3", None, Some(30), true),
            ("a", "api-4", None, Some(40), false),
        ],
        &[("a", "api-4", "api-3", &["api-4", "api-3", "api-2"])],
    );
    check_lineages(
        "revisions off: the newest runs and is the only one kept",
        1,
        &[
            ("a", "api-1", None, Some(10), true),
            ("a", "api-2", None, Some(20), false),
        ],
        &[("a", "api-2", "api-2", &["api-2"])],
    );
    check_lineages(
        "a bootkube checkpoint (no time) is the oldest",
        2,
        &[
            ("a", "api-1", None, None, false),
            ("a", "api-2", None, Some(5), false),
        ],
        &[("a", "api-2", "api-2", &["api-2"])],
    );
    check_lineages(
        "equal times: by name, whatever the input order",
        2,
        &[
            ("a", "api-b", None, Some(5), false),
            ("a", "api-a", None, Some(5), false),
        ],
        &[("a", "api-b", "api-b", &["api-b"])],
    );
    check_lineages(
        "the old pod's Secret rotated after the new pod was checkpointed: the newer \
         template generation is still the newest",
        2,
        &[
            ("a", "api-1", Some(1), Some(30), true),
            ("a", "api-2", Some(2), Some(20), false),
        ],
        &[("a", "api-2", "api-1", &["api-2", "api-1"])],
    );
    check_lineages(
        "a rollback is a new template generation: newest though its content is older",
        2,
        &[
            ("a", "api-2", Some(2), Some(20), true),
            ("a", "api-3", Some(3), Some(10), false),
        ],
        &[("a", "api-3", "api-2", &["api-3", "api-2"])],
    );
    check_lineages(
        "equal generations (a pod re-created from the same template): by write time",
        2,
        &[
            ("a", "api-x", Some(4), Some(30), false),
            ("a", "api-y", Some(4), Some(20), false),
        ],
        &[("a", "api-x", "api-x", &["api-x"])],
    );
    check_lineages(
        "a checkpoint without a generation (its labels lost) is older than any with one",
        2,
        &[
            ("a", "api-1", None, Some(50), false),
            ("a", "api-2", Some(2), Some(20), false),
        ],
        &[("a", "api-2", "api-2", &["api-2"])],
    );
    check_lineages(
        "lineages apart",
        2,
        &[
            ("a", "api-1", None, Some(10), true),
            ("b", "proxy-1", None, Some(20), false),
            ("a", "api-2", None, Some(30), false),
        ],
        &[
            ("a", "api-2", "api-1", &["api-2", "api-1"]),
            ("b", "proxy-1", "proxy-1", &["proxy-1"]),
        ],
    );
}

#[test]
fn a_lineage_is_a_daemon_sets_pods_or_one_pod() {
    let owner = |kind: &str, uid: &str| ControllerOwner {
        api_version: "apps/v1".into(),
        kind: kind.into(),
        name: "x".into(),
        uid: uid.into(),
    };
    let pod = id("api-1");
    assert_eq!(Lineage::of(&pod, Some(&owner("DaemonSet", "u1"))), ds("u1"));
    assert_eq!(
        Lineage::of(&pod, Some(&owner("DaemonSet", ""))),
        Lineage::Pod(pod.clone())
    );
    assert_eq!(
        Lineage::of(&pod, Some(&owner("ReplicaSet", "u1"))),
        Lineage::Pod(pod.clone())
    );
    assert_eq!(Lineage::of(&pod, None), Lineage::Pod(pod));
}

/// One pass: what the journal holds and what is seen.
struct Pass {
    runs: Option<bool>,
    ready: bool,
    terminating: bool,
    when_ready: bool,
    active: bool,
    /// `(hash, since, failures)`.
    handoff: Option<(&'static str, i64, u32)>,
    rejected: Option<(&'static str, i64, u32)>,
    now: i64,
}

const QUIET: Pass = Pass {
    runs: Some(false),
    ready: false,
    terminating: false,
    when_ready: false,
    active: false,
    handoff: None,
    rejected: None,
    now: 1000,
};

/// The outcome: serving, journal after, step, deadline.
#[allow(clippy::type_complexity)]
fn check_handoff(
    what: &str,
    pass: Pass,
    expected: (
        Serving,
        Option<(&str, i64, u32)>,
        Option<(&str, i64, u32)>,
        Option<Handoff>,
        Option<i64>,
    ),
) {
    let since = |e: Option<(&str, i64, u32)>| {
        e.map(|(h, s, failures)| HandoffRecord {
            spec_hash: h.to_owned(),
            since: t(s),
            failures,
        })
    };
    let (handoff_in, rejected_in) = (since(pass.handoff), since(pass.rejected));
    let input = HandoffInput {
        newest_hash: "new",
        newest_runs: pass.runs,
        newest_ready: pass.ready,
        newest_terminating: pass.terminating,
        retires_when_ready: pass.when_ready,
        active: pass.active,
        handoff: handoff_in.as_ref(),
        rejected: rejected_in.as_ref(),
        timeout: Duration::from_secs(120),
    };
    let got = handoff(&input, t(pass.now));
    let want = HandoffOutcome {
        serving: expected.0,
        handoff: since(expected.1),
        rejected: since(expected.2),
        step: expected.3,
        deadline: expected.4.map(t),
    };
    assert_eq!(got, want, "{what}");
}

#[test]
fn handoffs() {
    use Serving::*;
    check_handoff(
        "nothing runs, nothing journaled: as usual",
        QUIET,
        (AsUsual, None, None, None, None),
    );
    check_handoff(
        "the new parent runs beside an inactive checkpoint: nothing to hand over",
        Pass {
            runs: Some(true),
            ..QUIET
        },
        (AsUsual, None, None, None, None),
    );
    check_handoff(
        "the new parent runs while the known-good checkpoint serves: it gets the node",
        Pass {
            runs: Some(true),
            active: true,
            ..QUIET
        },
        (
            Standby,
            Some(("new", 1000, 0)),
            None,
            Some(Handoff::Started),
            Some(1120),
        ),
    );
    check_handoff(
        "a parent being deleted (its DaemonSet replacing it) gets no handoff: the checkpoint \
         serves on",
        Pass {
            runs: Some(true),
            terminating: true,
            active: true,
            ..QUIET
        },
        (Serve, None, None, None, None),
    );
    check_handoff(
        "a parent being deleted beside an inactive checkpoint (a rollout): as usual",
        Pass {
            runs: Some(true),
            terminating: true,
            ..QUIET
        },
        (AsUsual, None, None, None, None),
    );
    check_handoff(
        "a parent that binds beside the checkpoint (when-ready): the checkpoint serves on, \
         no handoff, no deadline",
        Pass {
            runs: Some(true),
            when_ready: true,
            active: true,
            ..QUIET
        },
        (Serve, None, None, None, None),
    );
    check_handoff(
        "when-ready, and a handoff journaled before: forgotten, the checkpoint serves on",
        Pass {
            runs: Some(true),
            when_ready: true,
            active: true,
            handoff: Some(("new", 880, 0)),
            ..QUIET
        },
        (Serve, None, None, None, None),
    );
    check_handoff(
        "when-ready beside an inactive checkpoint: as usual",
        Pass {
            runs: Some(true),
            when_ready: true,
            ..QUIET
        },
        (AsUsual, None, None, None, None),
    );
    check_handoff(
        "when-ready and Ready: the checkpoint retires",
        Pass {
            runs: Some(true),
            when_ready: true,
            ready: true,
            active: true,
            ..QUIET
        },
        (AsUsual, None, None, None, None),
    );
    check_handoff(
        "an unknown runtime starts no handoff",
        Pass {
            runs: None,
            active: true,
            ..QUIET
        },
        (AsUsual, None, None, None, None),
    );
    check_handoff(
        "under way, the parent crashed: the checkpoint waits for the deadline",
        Pass {
            handoff: Some(("new", 950, 0)),
            ..QUIET
        },
        (Standby, Some(("new", 950, 0)), None, None, Some(1070)),
    );
    check_handoff(
        "deadline passed, not Ready: the known-good checkpoint returns",
        Pass {
            runs: Some(true),
            handoff: Some(("new", 880, 0)),
            ..QUIET
        },
        (Serve, None, Some(("new", 1000, 1)), Some(Handoff::Failed), None),
    );
    check_handoff(
        "Ready on a synced view: the parent keeps the node",
        Pass {
            runs: Some(true),
            ready: true,
            handoff: Some(("new", 990, 0)),
            ..QUIET
        },
        (AsUsual, None, None, Some(Handoff::Ready), None),
    );
    check_handoff(
        "rejected: the known-good checkpoint serves while the parent runs",
        Pass {
            runs: Some(true),
            rejected: Some(("new", 500, 1)),
            ..QUIET
        },
        (Serve, None, Some(("new", 500, 1)), None, None),
    );
    check_handoff(
        "rejected, then seen Ready after all: forgotten",
        Pass {
            runs: Some(true),
            ready: true,
            rejected: Some(("new", 500, 1)),
            ..QUIET
        },
        (AsUsual, None, None, None, None),
    );
    check_handoff(
        "rejected with other content (a Secret it mounts rewritten since): still rejected \
         until its back-off has passed, when it is looked at again",
        Pass {
            runs: Some(true),
            active: true,
            rejected: Some(("old", 900, 1)),
            ..QUIET
        },
        (Serve, None, Some(("old", 900, 1)), None, Some(1200)),
    );
    // Issue 36: a rejection used to be for good while the pod lived, so a parent only slow
    // to start (it cannot bind its port while the checkpoint holds it) hung the rollout
    // until someone deleted it. It is retried with a back-off.
    check_handoff(
        "rejected, its back-off passed, the parent runs: a new handoff",
        Pass {
            runs: Some(true),
            active: true,
            rejected: Some(("new", 700, 1)),
            ..QUIET
        },
        (
            Standby,
            Some(("new", 1000, 1)),
            None,
            Some(Handoff::Started),
            Some(1120),
        ),
    );
    check_handoff(
        "a journal from before retries (no failures recorded) counts one failure",
        Pass {
            runs: Some(true),
            active: true,
            rejected: Some(("new", 700, 0)),
            ..QUIET
        },
        (
            Standby,
            Some(("new", 1000, 1)),
            None,
            Some(Handoff::Started),
            Some(1120),
        ),
    );
    check_handoff(
        "rejected twice: the back-off doubled, not yet",
        Pass {
            runs: Some(true),
            active: true,
            rejected: Some(("new", 700, 2)),
            ..QUIET
        },
        (Serve, None, Some(("new", 700, 2)), None, Some(1300)),
    );
    check_handoff(
        "a retried handoff fails: one more failure",
        Pass {
            runs: Some(true),
            handoff: Some(("new", 880, 1)),
            ..QUIET
        },
        (Serve, None, Some(("new", 1000, 2)), Some(Handoff::Failed), None),
    );
    check_handoff(
        "rejected, its back-off passed, but the parent is being deleted: no retry",
        Pass {
            runs: Some(true),
            terminating: true,
            active: true,
            rejected: Some(("new", 500, 1)),
            ..QUIET
        },
        (Serve, None, Some(("new", 500, 1)), None, None),
    );
    check_handoff(
        "rejected, its back-off passed, the parent does not run: no retry, no deadline",
        Pass {
            active: true,
            rejected: Some(("new", 500, 1)),
            ..QUIET
        },
        (Serve, None, Some(("new", 500, 1)), None, None),
    );
    check_handoff(
        "under way with other content: the same handoff, the same deadline",
        Pass {
            runs: Some(true),
            handoff: Some(("old", 950, 0)),
            ..QUIET
        },
        (Standby, Some(("old", 950, 0)), None, None, Some(1070)),
    );
    check_handoff(
        "a start recorded in the future (the clock went back): counted from now",
        Pass {
            handoff: Some(("new", 5000, 0)),
            ..QUIET
        },
        (Standby, Some(("new", 1000, 0)), None, None, Some(1120)),
    );
}

#[test]
fn handoff_retries_back_off_from_five_minutes_to_an_hour() {
    let check = |failures: u32, minutes: u64| {
        assert_eq!(
            handoff_retry_after(failures),
            Duration::from_secs(minutes * 60),
            "after {failures} failures"
        );
    };
    for (failures, minutes) in [
        (0, 5),
        (1, 5),
        (2, 10),
        (3, 20),
        (4, 40),
        (5, 60),
        (6, 60),
        (u32::MAX, 60),
    ] {
        check(failures, minutes);
    }
}

/// `crash_loop` for (unreachable, active, fallback, restarts now, first seen): the first
/// seen after, and whether it is set aside.
#[allow(clippy::type_complexity)]
fn check_crash_loop(
    what: &str,
    (unreachable, active, fallback): (bool, bool, bool),
    restarts: Option<u32>,
    seen: Option<(u32, i64)>,
    expected: (Option<(u32, i64)>, bool),
) {
    let seen = seen.map(|(first, at)| RestartsSeen { first, since: t(at) });
    let input = CrashLoopInput {
        unreachable,
        active,
        fallback,
        restarts,
        seen: seen.as_ref(),
    };
    let got = crash_loop(&input, t(100));
    let want = CrashLoopOutcome {
        seen: expected.0.map(|(first, at)| RestartsSeen { first, since: t(at) }),
        set_aside: expected.1,
    };
    assert_eq!(got, want, "{what}");
}

#[test]
fn crash_loops() {
    let all = (true, true, true);
    check_crash_loop(
        "the API is reachable",
        (false, true, true),
        Some(9),
        Some((0, 1)),
        (None, false),
    );
    check_crash_loop(
        "not active",
        (true, false, true),
        Some(9),
        Some((0, 1)),
        (None, false),
    );
    check_crash_loop(
        "no fallback: the best the node has",
        (true, true, false),
        Some(9),
        Some((0, 1)),
        (None, false),
    );
    check_crash_loop("not seen yet", all, None, None, (None, false));
    check_crash_loop(
        "not seen now: what was seen stays",
        all,
        None,
        Some((2, 1)),
        (Some((2, 1)), false),
    );
    check_crash_loop(
        "first seen: counted from there",
        all,
        Some(4),
        None,
        (Some((4, 100)), false),
    );
    check_crash_loop(
        "fewer restarts since",
        all,
        Some(6),
        Some((4, 1)),
        (Some((4, 1)), false),
    );
    check_crash_loop(
        "the pod was re-created: its count starts again",
        all,
        Some(1),
        Some((4, 1)),
        (Some((1, 100)), false),
    );
    check_crash_loop(
        "enough restarts since the first look: set aside",
        all,
        Some(4 + CRASH_LOOP_RESTARTS),
        Some((4, 1)),
        (None, true),
    );
    check_crash_loop("more still", all, Some(u32::MAX), Some((0, 1)), (None, true));
}

/// The module's example, once a doctest (`handoff` is internal to the crate now).
#[test]
fn a_handoff_started_fails_at_its_deadline_and_a_parent_beside_gets_none() {
    // The new parent runs while the known-good checkpoint serves: it gets the node.
    let input = HandoffInput {
        newest_hash: "new",
        newest_runs: Some(true),
        newest_ready: false,
        newest_terminating: false,
        retires_when_ready: false,
        active: true,
        handoff: None,
        rejected: None,
        timeout: Duration::from_secs(120),
    };
    let now = Timestamp(1_000);
    let started = handoff(&input, now);
    assert_eq!(
        (started.serving, started.step),
        (Serving::Standby, Some(Handoff::Started))
    );
    // Two minutes later it is still not Ready: the known-good checkpoint returns.
    let later = HandoffInput {
        active: false,
        handoff: started.handoff.as_ref(),
        ..input
    };
    let failed = handoff(&later, now.saturating_add(Duration::from_secs(120)));
    assert_eq!(
        (failed.serving, failed.step),
        (Serving::Serve, Some(Handoff::Failed))
    );

    // A parent that binds beside its checkpoint (`handoff: when-ready`) never gets the node
    // before it is Ready: the checkpoint serves on beside it.
    let beside = HandoffInput {
        retires_when_ready: true,
        ..input
    };
    assert_eq!(handoff(&beside, now).serving, Serving::Serve);
}
